/*
 * weight_share.h - one device copy of a weight for every backend instance
 * on the same device.
 *
 * Each session owns its backend; a backend that keeps weights in device
 * memory (backend/cuda) would otherwise hold its own copy of every tensor,
 * so n sessions of one model (batched decode, the server's parallel slots)
 * would need n copies: at full size (~81 GiB of weights) not even two fit
 * on one GPU. This registry lets the instances share: a copy is found by
 * device and key (the host view's address plus a fingerprint of type,
 * shape, size and first/last bytes, so a host buffer reused for another
 * tensor never hits a stale copy) and reference-counted; the last release
 * tells its caller to free the memory.
 *
 * The registry only records pointers: allocation, upload and free stay
 * with the backend. Thread-safe (one process-wide mutex).
 */
#ifndef DS4_BACKEND_WEIGHT_SHARE_H
#define DS4_BACKEND_WEIGHT_SHARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DS4_WSHARE_FP_BYTES 64

typedef struct {
    const void *host; /* the host view's data */
    size_t bytes;
    int type;
    int64_t ne[4];
    uint8_t head[DS4_WSHARE_FP_BYTES], tail[DS4_WSHARE_FP_BYTES];
} ds4_wshare_key;

/* The key of a host tensor of `bytes` bytes (type and shape as given;
 * dims past n_dims count as 1). */
void ds4_wshare_key_of(ds4_wshare_key *k, const void *host, size_t bytes, int type, int n_dims,
                       const int64_t *ne);
/* Whether two keys name the same tensor contents. */
bool ds4_wshare_key_equal(const ds4_wshare_key *a, const ds4_wshare_key *b);

/* A registered copy of k on device: its pointer with one more reference,
 * or NULL when there is none. */
void *ds4_wshare_acquire(int device, const ds4_wshare_key *k);
/* Register dev, a fresh copy of k on device, with one reference.
 * Returns false when out of memory (dev is then not registered). */
bool ds4_wshare_add(int device, const ds4_wshare_key *k, void *dev);
/* Drop one reference to dev (a pointer acquire or add returned). True when
 * it was the last: the caller frees the memory. False also for a pointer
 * that is not registered. */
bool ds4_wshare_release(int device, void *dev);
/* Registered copies (all devices); for tests. */
size_t ds4_wshare_count(void);

#ifdef __cplusplus
}
#endif

#endif
