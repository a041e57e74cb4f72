/*
 * test_weight_share.c - the shared device-weight registry
 * (backend/weight_share.h) that lets every backend instance on a device use
 * one copy of a tensor: keys tell tensors apart by address, type, shape,
 * size and contents; references count the holders, and only the last
 * release frees; devices never share; concurrent use loses no entry.
 */
#include "backend/weight_share.h"
#include "tests/test.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

static uint8_t buf_a[4096], buf_b[4096];
static int dev_a, dev_b; /* stand-ins for device memory: only addresses matter */

static void key2(ds4_wshare_key *k, const void *host, size_t bytes, int type, int64_t ne0, int64_t ne1)
{
    const int64_t ne[2] = {ne0, ne1};
    ds4_wshare_key_of(k, host, bytes, type, 2, ne);
}

static void test_key(void)
{
    for (int i = 0; i < 4096; i++) buf_a[i] = (uint8_t)(i * 7), buf_b[i] = (uint8_t)(i * 7);
    ds4_wshare_key k, same, other_host, other_type, other_shape;
    key2(&k, buf_a, 4096, 8, 32, 128);
    key2(&same, buf_a, 4096, 8, 32, 128);
    key2(&other_host, buf_b, 4096, 8, 32, 128); /* same bytes, another tensor */
    key2(&other_type, buf_a, 4096, 1, 32, 128);
    key2(&other_shape, buf_a, 4096, 8, 64, 64);
    EXPECT(ds4_wshare_key_equal(&k, &same));
    EXPECT(!ds4_wshare_key_equal(&k, &other_host));
    EXPECT(!ds4_wshare_key_equal(&k, &other_type));
    EXPECT(!ds4_wshare_key_equal(&k, &other_shape));
    EXPECT(k.ne[2] == 1 && k.ne[3] == 1); /* dims past n_dims count as 1 */
    /* the host buffer reused for other contents: first or last bytes differ */
    buf_a[0] ^= 1;
    key2(&same, buf_a, 4096, 8, 32, 128);
    EXPECT(!ds4_wshare_key_equal(&k, &same));
    buf_a[0] ^= 1;
    buf_a[4095] ^= 1;
    key2(&same, buf_a, 4096, 8, 32, 128);
    EXPECT(!ds4_wshare_key_equal(&k, &same));
    buf_a[4095] ^= 1;
    /* a tensor smaller than the fingerprint */
    ds4_wshare_key s1, s2;
    key2(&s1, buf_a, 10, 0, 10, 1);
    key2(&s2, buf_a, 10, 0, 10, 1);
    EXPECT(ds4_wshare_key_equal(&s1, &s2));
    EXPECT(s1.head[9] == buf_a[9] && s1.head[10] == 0);
}

static void test_share_and_release(void)
{
    ds4_wshare_key k;
    key2(&k, buf_a, 4096, 8, 32, 128);
    EXPECT(ds4_wshare_count() == 0);
    EXPECT(ds4_wshare_acquire(0, &k) == NULL); /* nothing yet: the first backend uploads */
    EXPECT(ds4_wshare_add(0, &k, &dev_a));
    EXPECT(ds4_wshare_count() == 1);
    EXPECT(ds4_wshare_acquire(0, &k) == &dev_a); /* a second backend reuses it */
    EXPECT(ds4_wshare_acquire(0, &k) == &dev_a); /* and a third */
    EXPECT(ds4_wshare_acquire(1, &k) == NULL);   /* another GPU has its own copy */
    EXPECT(ds4_wshare_add(1, &k, &dev_b));
    EXPECT(ds4_wshare_count() == 2);
    EXPECT(!ds4_wshare_release(0, &dev_a));
    EXPECT(!ds4_wshare_release(0, &dev_a));
    EXPECT(!ds4_wshare_release(1, &dev_a)); /* wrong device: not registered there */
    EXPECT(ds4_wshare_release(0, &dev_a));  /* the last holder frees */
    EXPECT(ds4_wshare_acquire(0, &k) == NULL);
    EXPECT(!ds4_wshare_release(0, &dev_a)); /* released pointers are gone */
    EXPECT(ds4_wshare_release(1, &dev_b));
    EXPECT(ds4_wshare_count() == 0);
}

#define N_THREADS 4
#define N_KEYS 300

static uint8_t thread_bufs[N_THREADS][N_KEYS];

static void *worker(void *arg)
{
    const int t = (int)(intptr_t)arg;
    int ok = 1;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < N_KEYS; i++) {
            ds4_wshare_key k;
            key2(&k, &thread_bufs[t][i], 1, 0, 1, 1);
            ok &= ds4_wshare_acquire(t, &k) == NULL;
            ok &= ds4_wshare_add(t, &k, &thread_bufs[t][i]);
            ok &= ds4_wshare_acquire(t, &k) == &thread_bufs[t][i];
        }
        for (int i = 0; i < N_KEYS; i++) {
            ok &= !ds4_wshare_release(t, &thread_bufs[t][i]);
            ok &= ds4_wshare_release(t, &thread_bufs[t][i]);
        }
    }
    return (void *)(intptr_t)ok;
}

static void test_threads(void)
{
    pthread_t th[N_THREADS];
    for (int t = 0; t < N_THREADS; t++) pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
    int ok = 1;
    for (int t = 0; t < N_THREADS; t++) {
        void *r;
        pthread_join(th[t], &r);
        ok &= (int)(intptr_t)r;
    }
    EXPECT(ok);
    EXPECT(ds4_wshare_count() == 0);
}

int main(void)
{
    RUN(test_key);
    RUN(test_share_and_release);
    RUN(test_threads);
    return test_finish();
}
