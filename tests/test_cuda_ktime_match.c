/*
 * test_cuda_ktime_match.c - the in-graph kernel times' matching of one
 * replay's stamps to the launches noted in the recording
 * (ds4_cuda_ktime_match_replay, cuda_ktrace.cu; host code, no GPU needed):
 * each case is a small recording and a stamp sequence written out by
 * hand, with the sums, the unmatched stamps and the launches without a
 * stamp that the function's contract (backend/cuda/cuda_api.h) gives, and
 * with the launches' streams, each launch's time to its stream's next
 * stamp.
 */
#include "tests/test.h"

#include <string.h>

#if DS4_HAVE_CUDA
#include "backend/cuda/cuda_api.h"

enum { A = 11, B = 22, C = 33, D = 44, E = 55, S = 66 }; /* launch shapes */

typedef struct {
    double sum[64], lane[64];
    unsigned char used[64];
    ds4_cuda_ktime_match m;
} kt_run;

/* stamps given as (time, shape) pairs; lanes: the launches' streams, or NULL */
static void kt_match_lanes(kt_run *r, const unsigned long long *stamps, int n, const unsigned long long *shapes,
                           int nk, const unsigned char *lanes)
{
    memset(r, 0, sizeof *r);
    ds4_cuda_ktime_match_replay(stamps, (unsigned long long)n, shapes, nk, r->sum, r->used, lanes, r->lane, &r->m);
}
static void kt_match(kt_run *r, const unsigned long long *stamps, int n, const unsigned long long *shapes, int nk)
{
    kt_match_lanes(r, stamps, n, shapes, nk, NULL);
}

/* every launch stamps, in order: each gets the time to the next stamp */
static void test_in_order(void)
{
    const unsigned long long shapes[] = {A, B, C, A};
    const unsigned long long st[] = {100, A, 110, B, 130, C, 160, A};
    kt_run r;
    kt_match(&r, st, 4, shapes, 4);
    EXPECT(r.sum[0] == 10.0 && r.sum[1] == 20.0 && r.sum[2] == 30.0 && r.sum[3] == 0.0);
    EXPECT(r.m.unmatched == 0 && r.m.unstamped == 0);
    EXPECT(r.m.span_ns == 60.0);
}

/* a launch whose kernel did not stamp is passed over (its time goes to the
 * launch before it) and counted; a stamp of no noted shape is counted */
static void test_missing_and_extra(void)
{
    const unsigned long long shapes[] = {A, B, C, D};
    const unsigned long long st[] = {0, A, 5, C, 9, D, 20, E};
    kt_run r;
    kt_match(&r, st, 4, shapes, 4);
    EXPECT(r.sum[0] == 5.0 && r.sum[1] == 0.0 && r.sum[2] == 4.0 && r.sum[3] == 11.0);
    EXPECT_MSG(r.m.unstamped == 1, "%ld launches without a stamp", r.m.unstamped);
    EXPECT_MSG(r.m.unmatched == 1, "%ld unmatched stamps", r.m.unmatched);
}

/* a side stream's kernel (S, launched after B) stamps before B: it takes
 * its own launch, and B's stamp then finds B behind it */
static void test_side_stream_order(void)
{
    const unsigned long long shapes[] = {A, B, S, C};
    const unsigned long long st[] = {0, A, 3, S, 5, B, 9, C};
    kt_run r;
    kt_match(&r, st, 4, shapes, 4);
    EXPECT(r.m.unmatched == 0 && r.m.unstamped == 0);
    EXPECT(r.sum[0] == 3.0 && r.sum[2] == 2.0 && r.sum[1] == 4.0 && r.sum[3] == 0.0);
}

/* stamps written out of time order (two kernels stamping at once) add
 * nothing negative; the span is the latest minus the earliest */
static void test_time_backwards(void)
{
    const unsigned long long shapes[] = {A, B, C};
    const unsigned long long st[] = {10, A, 8, B, 15, C};
    kt_run r;
    kt_match(&r, st, 3, shapes, 3);
    EXPECT(r.sum[0] == 0.0 && r.sum[1] == 7.0);
    EXPECT(r.m.span_ns == 7.0);
}

/* launches of one shape take the stamps in order; the one left over is
 * the one without a stamp */
static void test_same_shape(void)
{
    const unsigned long long shapes[] = {A, A, A, A};
    const unsigned long long st[] = {0, A, 1, A, 3, A};
    kt_run r;
    kt_match(&r, st, 3, shapes, 4);
    EXPECT(r.used[0] && r.used[1] && r.used[2] && !r.used[3]);
    EXPECT(r.m.unstamped == 1 && r.m.unmatched == 0);
}

/* a launch more than 32 ahead of the expected one is out of reach */
static void test_window(void)
{
    unsigned long long shapes[41];
    for (int i = 0; i < 40; i++) shapes[i] = A;
    shapes[40] = B;
    const unsigned long long st[] = {0, B};
    kt_run r;
    kt_match(&r, st, 1, shapes, 41);
    EXPECT(r.m.unmatched == 1 && r.m.unstamped == 41);
}

/* streams: main-stream launches A B C and side launches S (after A) and D
 * (after B); S stamps before B, D after C. Each launch's time to the next
 * stamp (any stream) as before; to its own stream's next stamp: A to B,
 * B to C, S to D; each stream's last gets none */
static void test_lanes(void)
{
    const unsigned long long shapes[] = {A, S, B, D, C};
    const unsigned char lanes[] = {0, 1, 0, 1, 0};
    const unsigned long long st[] = {0, A, 3, S, 5, B, 9, C, 12, D};
    kt_run r;
    kt_match_lanes(&r, st, 5, shapes, 5, lanes);
    EXPECT(r.m.unmatched == 0 && r.m.unstamped == 0);
    EXPECT(r.sum[0] == 3.0 && r.sum[1] == 2.0 && r.sum[2] == 4.0 && r.sum[4] == 3.0 && r.sum[3] == 0.0);
    EXPECT_MSG(r.lane[0] == 5.0 && r.lane[2] == 4.0 && r.lane[4] == 0.0, "main stream: %g %g %g", r.lane[0], r.lane[2],
               r.lane[4]);
    EXPECT_MSG(r.lane[1] == 9.0 && r.lane[3] == 0.0, "side stream: %g %g", r.lane[1], r.lane[3]);
    /* the main stream's times add up to its span: the step */
    EXPECT(r.lane[0] + r.lane[2] + r.lane[4] == 9.0);
}

/* a stamp matching no launch takes no stream's time; a stream's stamp
 * written before its predecessor's time adds nothing negative */
static void test_lanes_unmatched_and_backwards(void)
{
    const unsigned long long shapes[] = {A, B, C};
    const unsigned char lanes[] = {0, 0, 0};
    const unsigned long long st[] = {10, A, 12, E, 8, B, 20, C};
    kt_run r;
    kt_match_lanes(&r, st, 4, shapes, 3, lanes);
    EXPECT(r.m.unmatched == 1 && r.m.unstamped == 0);
    EXPECT_MSG(r.lane[0] == 0.0 && r.lane[1] == 12.0 && r.lane[2] == 0.0, "lanes: %g %g %g", r.lane[0], r.lane[1],
               r.lane[2]);
}

int main(void)
{
    RUN(test_in_order);
    RUN(test_missing_and_extra);
    RUN(test_side_stream_order);
    RUN(test_time_backwards);
    RUN(test_same_shape);
    RUN(test_window);
    RUN(test_lanes);
    RUN(test_lanes_unmatched_and_backwards);
    return test_finish();
}
#else
int main(void) { return test_skip_all_no_cuda(); }
#endif
