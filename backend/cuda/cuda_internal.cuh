/*
 * cuda_internal.cuh - what the backend's .cu files share and C callers
 * must not see: the context struct, error plumbing, argument checks.
 */
#ifndef DS4_CUDA_INTERNAL_CUH
#define DS4_CUDA_INTERNAL_CUH

#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_api.h"
extern "C" {
#include "util/error.h"
}

/* A product's input handed over as Q8_0 blocks by the kernel that wrote
 * it, in q (n int8 values, the output's layout) and d (n / 32 scales).
 * want (q8o, q8a): the next producer is asked to store them; asked (q8s):
 * the sublayer input whose site is asked to; y: the output they are of
 * (NULL: none on offer), taken by the next product that reads y (q8o, q8a)
 * or by every one until the sublayer's release (q8s); cap: the buffers'
 * values. */
struct ds4_q8_handoff {
    int want;
    const float *asked;
    const float *y;
    int64_t n, cap;
    int8_t *q;
    float *d;
    int nt; /* q8m: the tokens of y (its rows), n their width */
    unsigned long long seq; /* q8m: ds4_launch_seq right after the maker's launch */
};

struct ds4_cuda {
    int device;
    int n_sm;
    int cc_major; /* compute capability: the int8 tensor-core kernels need 8, clusters 9 */
    cudaStream_t stream;
    cublasHandle_t blas;
    cudaEvent_t ev_start, ev_stop;
    ds4_cuda_gemm_precision gemm_precision;
    int mv_split_below; /* split-K when a matvec has fewer row blocks than this (env DS4_CUDA_SPLITK = n_sm multiple x2) */
    int mv_occupancy; /* matvec blocks per SM to allow for: 3 (default) or 2 (env DS4_CUDA_MV_OCC=2) */
    void *scratch; /* GEMM tiles: dequantized weights + converted x */
    size_t scratch_bytes;
    void *split; /* split-K partial sums of the matvec */
    size_t split_bytes;
    void *act; /* quantized activation rows of the int8 matvec (cuda_mmvq.cu) */
    size_t act_bytes;
    unsigned mem_gen; /* bumped whenever scratch/split is reallocated (recorded CUDA graphs hold these pointers) */
    /* Offered by the shared expert's side stream to the next routed down
     * on this stream (cuda_ops_moe_ahead.cu): its result y (token t at y +
     * t * rows) and the event that marks it written. The down kernels that
     * can add it in their store wait for the event there, not earlier, and
     * set taken; otherwise the offerer adds it with a kernel of its own. */
    struct {
        const float *y;
        cudaEvent_t ready;
        int taken;
    } down_add;
    /* The Q8_0 hand-off of ops.h matmul_grouped_chain (cuda_q8split_fused.cu):
     * the next grouped one-token product (o_a) also stores its outputs'
     * Q8_0 blocks, which the next product reading them (o_b) takes instead
     * of quantizing them */
    ds4_q8_handoff q8o;
    /* The same for ops.h attention_out_project (DS4_CUDA_Q8_HANDOFF_A): one
     * token's attention combine stores its output's Q8_0 blocks for o_a */
    ds4_q8_handoff q8a;
    /* And for ops.h sublayer_input (DS4_CUDA_Q8_HANDOFF_S): one token's
     * hyper-connection site stores the sublayer input's Q8_0 blocks; every
     * fused Q8_0 product that reads it takes them until the sublayer ends */
    ds4_q8_handoff q8s;
    /* A batched step's (9-16 tokens) q_a norm stores its rows also in the
     * tensor-core products' fragment order (cuda_q8m.cuh qm_quant_put,
     * cb_rmsnorm_q8m_kernel), and its attention combine its outputs
     * (cuda_attn_split.cu); the next such product (cuda_q8split_mma.cu)
     * takes them where it reads y and nothing was launched or copied in
     * between (ds4_launch_seq: nothing has written y since), instead of
     * launching the quantizer. q holds QM_TOK x n values (n: a token's
     * width, all its groups), d their blocks' scales. One batched o_a
     * also stores its outputs' blocks for o_b (q8m_want, set around it by
     * matmul_grouped_chain) while it takes the combine's: two buffers,
     * the offer in q8m[q8m_cur], each maker writing the other
     * (ds4_q8m_maker, ds4_q8m_offer). */
    ds4_q8_handoff q8m[2];
    int q8m_cur, q8m_want;
    /* And a batched step's sublayer input (ops.h sublayer_input, 9-16
     * tokens): the site stores its blocks in that order (q8ms, as q8s for
     * one token), which every tensor-core product reading it takes until
     * the sublayer ends, the shared expert's on its side context too
     * (parent: the context a side context was opened beside). */
    ds4_q8_handoff q8ms;
    struct ds4_cuda *parent;
    char desc[256];
};

/* A hyper-connection site's Sinkhorn left for later (cuda_hc_cluster.cu,
 * DS4_CUDA_HC_SINK_LATE): comb holds T tokens' 16 Sinkhorn inputs, to be
 * replaced in place by the 4 x 4 matrices. comb NULL: no job. */
struct ds4_sink_job {
    float *comb;
    int T, iters;
    float eps;
};

/* Return DS4_ERR_BACKEND naming the failed call when a CUDA call fails. */
#define DS4_CUDA_CHECK(call)                                                    \
    do {                                                                        \
        cudaError_t ds4_e_ = (call);                                            \
        if (ds4_e_ != cudaSuccess)                                              \
            return ds4_fail(DS4_ERR_BACKEND, "cuda: %s failed: %s (%s:%d)",     \
                            #call, cudaGetErrorString(ds4_e_), __FILE__, __LINE__); \
    } while (0)

/* Values per block and bytes per block; 0 for unsupported types. */
static inline int ds4_cuda_block_elems(ds4_type t)
{
    switch (t) {
    case DS4_TYPE_Q8_0: case DS4_TYPE_MXFP4: return 32;
    case DS4_TYPE_Q2_K: case DS4_TYPE_Q4_K: case DS4_TYPE_IQ2_XXS: return 256;
    case DS4_TYPE_F16: case DS4_TYPE_BF16: case DS4_TYPE_F32: return 1;
    default: return 0;
    }
}

static inline int ds4_cuda_block_bytes(ds4_type t)
{
    switch (t) {
    case DS4_TYPE_Q8_0: return 34;
    case DS4_TYPE_MXFP4: return 17;
    case DS4_TYPE_Q2_K: return 84;
    case DS4_TYPE_Q4_K: return 144;
    case DS4_TYPE_IQ2_XXS: return 66;
    case DS4_TYPE_F16: case DS4_TYPE_BF16: return 2;
    case DS4_TYPE_F32: return 4;
    default: return 0;
    }
}

/* Alignment the block fields need when read in place (u16 / u32 loads). */
static inline int ds4_cuda_type_align(ds4_type t)
{
    switch (t) {
    case DS4_TYPE_MXFP4: return 1;
    case DS4_TYPE_Q2_K: case DS4_TYPE_Q4_K: case DS4_TYPE_F32: return 4;
    default: return 2;
    }
}

/* Checks shared by every weight op: type, shape, alignment. */
ds4_status ds4_cuda_check_weights(const char *op, ds4_type type, const void *d_w,
                                  int64_t rows, int64_t cols);

/* Strided variants for the ops (x_ld, y_ld: elements between tokens). */
ds4_status ds4_cuda_matvec_ld(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                              int64_t cols, const float *d_x, int64_t x_ld, int64_t n_tok,
                              float *d_y, int64_t y_ld);
ds4_status ds4_cuda_gemm_ld(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows,
                            int64_t cols, const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y,
                            int64_t y_ld, ds4_cuda_gemm_precision prec);
/* ds4_cuda_matvec_grouped (block-diagonal): cuda_api.h. */

/* The int8-activation decode matvec (cuda_mmvq.cu) for Q8_0, Q2_K and
 * IQ2_XXS weights: whether it takes this matrix (type, 16-byte rows and
 * alignment; DS4_CUDA_MMVQ=0 turns it off: ds4_cuda_mmvq_active), then the dense form (tokens
 * x_ld / y_ld floats apart) and the slot form (routed experts by device
 * ids, or ids NULL and n_expert = G groups used block-diagonally; slot s
 * reads x row s / x_share). */
ds4_status ds4_cuda_mmvq_dense(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                               const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld);
ds4_status ds4_cuda_mmvq_slots(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                               const int32_t *d_ids, int64_t n_expert, int64_t expert_bytes, int64_t n_slots,
                               int64_t x_share, const float *d_x, float *d_y);

/* *buf (*have bytes) grown to at least need bytes after the stream drains
 * (a device buffer the context keeps: cu->split, cu->scratch); the memory
 * generation moves, so recorded graphs are re-recorded (cuda_matvec.cu). */
ds4_status ds4_cuda_grow(ds4_cuda *cu, void **buf, size_t *have, size_t need, const char *what);
/* cu->split (the split-K partial sums) of at least need bytes. */
ds4_status ds4_cuda_split_reserve(ds4_cuda *cu, size_t need);

/* The float-weight decode matvec (cuda_fmv.cu), taken when
 * ds4_cuda_fmv_active; tokens x_ld / y_ld floats apart, up to 4 per
 * weight pass, every group of 4 in one launch (any n_tok up to 262140). */
ds4_status ds4_cuda_fmv_dense(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                              const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld);
/* cuda_fmv_xr.cu: 5 to 63 tokens on a matrix of a block per row, each
 * thread's activation values in registers for all its rows, every token
 * bit for bit as ds4_cuda_fmv_dense gives it; 1 when taken (launched). */
int ds4_fmv_xr_dense(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *d_x,
                     int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld);
/* The same for 64 or more tokens and at most 1024 rows over column
 * slices, the slices added in order (cuda_fmv_tall.cu: F16 / BF16 weights
 * on the tf32 tensor cores, F32 in fp32-fma tiles; DS4_CUDA_FMV_TALL=0:
 * never); other sums' order than the matvec's. */
extern "C" bool ds4_cuda_fmv_tall_covers(ds4_type type, int64_t rows, int64_t cols, int64_t n_tok);
extern "C" ds4_status ds4_cuda_fmv_tall(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                       const float *d_x, int64_t x_ld, int64_t n_tok, float *d_y, int64_t y_ld);
/* y1 = W1 x and y2 = W2 x (one token, two matrices of one float type) in
 * one launch, each bit for bit its own launch; 0 when not covered. With
 * launch = 0 only whether it is covered. */
int ds4_cuda_fmv_pair(ds4_cuda *cu, ds4_type type, const void *w1, int64_t rows1, float *y1, const void *w2,
                      int64_t rows2, float *y2, int64_t cols, const float *x, int launch);

/* y = W rmsnorm(x, norm_w, eps) for one token of 1024 values: the rmsnorm
 * op's values, then each row as ds4_cuda_fmv_dense computes it, in one
 * launch; x left as it is. 0 when not covered; with launch = 0 only
 * whether it is covered. */
int ds4_cuda_fmv_norm(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *x,
                      const float *norm_w, float eps, float *y, int launch);

/* y[k] = W[k] x for n (2-4) float matrices of one type and width (cols)
 * on one token, in one launch, each row as its own matrix's launch
 * computes it (a block a row: taken only where each matrix alone gets
 * that). 0 when not covered; with launch = 0 only whether it is covered. */
int ds4_cuda_fmv_multi(ds4_cuda *cu, ds4_type type, int n, const void *const *w, const int64_t *rows, float *const *y,
                       int64_t cols, const float *x, int launch);

/* The router of one token in one launch: logits = W x (rows = n_expert,
 * each row as ds4_cuda_fmv_dense computes it) and, in the launch's last
 * block, the moe_route kernel's picks and weights (cuda_moe_route.cuh).
 * ticket: a device counter at 0, left at 0. 0 when not covered; with
 * launch = 0 only whether it is covered. sink: a site's Sinkhorn that an
 * extra block runs beside the rows (NULL, or comb NULL: none). */
struct cb_route_args;
int ds4_cuda_fmv_route(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols, const float *x,
                       float *logits, const cb_route_args *route, unsigned *ticket, int launch,
                       const ds4_sink_job *sink);

/* The expert FFNs' fused decode forms ds4_cuda_mmvq_swiglu and
 * ds4_cuda_mmvq_down: cuda_api.h. */

/* In-graph kernel times (DS4_CUDA_KTIME=1, cuda_ktrace.cu): ncu times a
 * kernel alone, serialized and (for weights from HBM) with caches flushed,
 * which leaves out what a replayed step overlaps (a kernel's loads issued
 * before its dependency wait beside its predecessor's tail) and adds what
 * it does not pay (the activation read from DRAM behind the weights). So
 * with the switch on, block 0 of every kernel stamps the global timer when
 * its dependency wait returns, that is when its predecessor completed: the
 * difference of two neighbours' stamps is what a kernel adds to the step.
 * Each translation unit has its own copy of the buffer pointer (no
 * relocatable device code), null unless the switch is on; every copy
 * registers a setter at start-up. */
static __constant__ unsigned long long *ds4_kt_buf;
enum { DS4_KT_CAP = 16384 }; /* stamps a replayed step (buffer: a counter, then time and shape pairs) */
void ds4_kt_register(void (*set)(unsigned long long *));
static void ds4_kt_set_here(unsigned long long *p) { (void)cudaMemcpyToSymbol(ds4_kt_buf, &p, sizeof p); }
[[maybe_unused]] static const int ds4_kt_registered = (ds4_kt_register(ds4_kt_set_here), 0);
/* the launch helpers note each kernel launched while a step is recorded,
 * and its stream */
void ds4_kt_note_launch(const void *kernel, unsigned long long shape, const void *stream);

/* The launch shape a stamp carries, so that the host can match stamps to
 * the launches it noted when some kernels do not stamp (or stamp outside
 * the recording). */
__host__ __device__ __forceinline__ unsigned long long ds4_kt_shape(unsigned gx, unsigned gy, unsigned gz, unsigned bx)
{
    return (unsigned long long)gx | (unsigned long long)(gy & 0xffffu) << 32 | (unsigned long long)(gz & 0xffu) << 48 |
           (unsigned long long)((bx >> 5) & 0xffu) << 56;
}

/* A launch stamp in two halves, so that the stamping thread does not
 * wait for an atomic's round trip after its dependency wait: that thread
 * (thread 0 of block 0) is also the phase marker of several kernels, and
 * the wait put its start mark (and its warp's work) one global round trip
 * late. The slot is taken before the wait: in one stream a kernel's blocks
 * are scheduled only after its predecessor took its slot (the predecessor
 * used the slot before it let its dependents launch), so the slots keep
 * launch order; the round trip overlaps the predecessor's tail. The time is
 * read after the wait, as before. */
__device__ __forceinline__ unsigned long long ds4_kt_stamp_slot()
{
    /* the pointer is read by one thread only: a constant-cache miss in
     * every warp of every kernel would add to each kernel's start */
    if ((blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) != 0) return ~0ull;
    unsigned long long *b = ds4_kt_buf;
    return b ? atomicAdd(b, 1ull) : ~0ull;
}
__device__ __forceinline__ void ds4_kt_stamp_time(unsigned long long i)
{
    if (i >= DS4_KT_CAP) return; /* not the stamping thread, the switch off, or the buffer full */
    unsigned long long *b = ds4_kt_buf;
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    b[1 + 2 * i] = t;
    b[2 + 2 * i] = ds4_kt_shape(gridDim.x, gridDim.y, gridDim.z, blockDim.x);
}

/* Phases inside a kernel (the same switch): ncu tells how busy a kernel's
 * SMs are, not where in its chain of barriers and round trips a replayed
 * kernel spends its microseconds. A few long kernels have one thread they
 * pick (`me`, of their first block) note the global timer after its
 * dependency wait (ds4_kt_start) and at the ends of its phases
 * (ds4_kt_phase): the time since the start is added to the phase's total
 * in a region after the stamps, which the host reads with them
 * (cuda_ktrace.cu names the phases). The start time is kept in shared
 * memory, so no register is held across the kernel; with the switch off a
 * mark costs the picked thread a branch. */
enum { DS4_KT_SITES = 8, DS4_KT_PHASES = 8, DS4_KT_PH = 1 + 2 * DS4_KT_CAP };
/* (the sites, DS4_KT_HCC .., are in cuda_api.h for the tests) */
__device__ __forceinline__ unsigned long long *ds4_kt_t0_slot(int site)
{
    __shared__ unsigned long long t0[DS4_KT_SITES]; /* a block may hold two sites' marking threads */
    return &t0[site];
}
/* ds4_kt_start_at / ds4_kt_phase_at keep the start at slot (8 bytes of
 * the kernel's own shared memory): a kernel at the 48 KB limit of static
 * shared memory passes one of its dynamic bytes. */
__device__ __forceinline__ void ds4_kt_start_at(bool me, unsigned long long *slot)
{
    if (!me) return;
    unsigned long long t = 0;
    if (ds4_kt_buf) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *slot = t;
}
__device__ __forceinline__ void ds4_kt_phase_at(bool me, int site, int k, const unsigned long long *slot)
{
    if (!me) return;
    const unsigned long long t0 = *slot;
    if (t0 == 0) return; /* the switch is off */
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    unsigned long long *b = ds4_kt_buf + DS4_KT_PH + 2 * (site * DS4_KT_PHASES + k);
    atomicAdd(b, t > t0 ? t - t0 : 0ull);
    atomicAdd(b + 1, 1ull);
}
__device__ __forceinline__ void ds4_kt_start(bool me, int site)
{
    if (me) ds4_kt_start_at(me, ds4_kt_t0_slot(site));
}
__device__ __forceinline__ void ds4_kt_phase(bool me, int site, int k)
{
    if (me) ds4_kt_phase_at(me, site, k, ds4_kt_t0_slot(site));
}

/* Programmatic dependent launch (sm_90 and later). A decode step is ~45
 * kernels per layer, most of them a few microseconds long, and the gap
 * between two graph-replayed kernels (the next grid's launch and block
 * scheduling) was measured at about as much as their run time. Launched
 * with the programmatic-serialization attribute, a kernel's blocks are
 * scheduled while its predecessor still runs and wait in ds4_pdl_enter()
 * until that grid has completed and its memory is visible. So every kernel
 * launched by ds4_launch() calls ds4_pdl_enter() before it touches global
 * memory (reads or writes); it then lets its own successor start launching.
 * Results are unchanged: each kernel still starts its work only after the
 * previous one finished. DS4_CUDA_PDL=0 launches plainly (read once). */
__device__ __forceinline__ void ds4_pdl_enter()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned long long kt = ds4_kt_stamp_slot();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    ds4_kt_stamp_time(kt);
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#else
    ds4_kt_stamp_time(ds4_kt_stamp_slot());
#endif
}

/* Split cluster barrier: arrive (release) and wait (acquire). Between them
 * a block may work on; it must not exit before the wait while another
 * block may still read its shared memory. Release makes the arriving
 * thread's earlier writes visible, global ones included, so it waits for
 * those to be acknowledged: a kernel whose global stores are not needed by
 * the cluster issues them after its last arrival. */
__device__ __forceinline__ void ds4_cluster_arrive()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ void ds4_cluster_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

/* Pushes between the blocks of a cluster (sm_90): a block stores into
 * another's shared memory with st.async, whose arrival counts its bytes
 * off a transaction barrier (mbarrier) in the receiver; the receiver waits
 * on its own barrier only, where a pull takes a full cluster barrier and
 * then a round trip a remote load. The barrier is made ready before any
 * block may push into it: ds4_mbar_init (one thread) and
 * ds4_mbar_init_fence before the cluster arrival that every pusher waits
 * on (ds4_cluster_arrive_relaxed / ds4_cluster_wait). A receiver exits
 * only after all its bytes have come (it waits for them), so no block
 * stores into one that has gone. Addresses are shared-window offsets
 * (__cvta_generic_to_shared). */
__device__ __forceinline__ void ds4_cluster_arrive_relaxed()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
#endif
}
/* The barrier at mb, one arrival (this call's), expecting `bytes` of pushes. */
__device__ __forceinline__ void ds4_mbar_init(uint32_t mb, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mb) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void ds4_mbar_init_fence()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* Wait for the barrier's first phase: every expected byte has come, and
 * (acquire at cluster scope: st.async's count is a release there) what
 * the pushes stored is visible. */
__device__ __forceinline__ void ds4_mbar_wait0(uint32_t mb)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred p;\n"
                 "W%=:\n\t"
                 "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], 0;\n\t"
                 "@!p bra W%=;\n}" ::"r"(mb)
                 : "memory");
#endif
}
/* The same shared-window address in the block of cluster rank `rank`. */
__device__ __forceinline__ uint32_t ds4_cluster_map(uint32_t a, uint32_t rank)
{
    uint32_t r = a;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
#endif
    return r;
}
/* Push 16 bytes (v) to ra, counted off the barrier at rmb (both already
 * mapped to the receiver: ds4_cluster_map). */
__device__ __forceinline__ void ds4_push16(uint32_t ra, float4 v, uint32_t rmb)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(ra),
                 "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rmb)
                 : "memory");
#endif
}
/* Push one double. */
__device__ __forceinline__ void ds4_push8(uint32_t ra, double v, uint32_t rmb)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(ra),
                 "l"(__double_as_longlong(v)), "r"(rmb)
                 : "memory");
#endif
}

/* A ring of bulk copies from global into this block's shared memory (sm_90):
 * a stage's transaction barrier (ds4_mbar_init1, then ds4_mbar_init_fence
 * before its first use) is armed for a phase's bytes by the one thread that
 * issues that phase's copies (ds4_mbar_expect, then ds4_bulk_g2s), and the
 * readers wait for the phase by its parity. A stage is copied into again
 * only after its readers have used what they read from it, with
 * ds4_fence_async_after_reads between (the reads were the generic proxy's,
 * the copy is the async proxy's). Sizes and addresses: multiples of 16. */
__device__ __forceinline__ void ds4_mbar_init1(uint32_t mb)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(mb) : "memory");
#endif
}
__device__ __forceinline__ void ds4_mbar_expect(uint32_t mb, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(mb), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void ds4_bulk_g2s(uint32_t dst, const void *src, uint32_t bytes, uint32_t mb)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(mb)
                 : "memory");
#endif
}
__device__ __forceinline__ void ds4_mbar_wait_parity(uint32_t mb, uint32_t parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("{\n\t.reg .pred p;\n"
                 "W%=:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n\t"
                 "@!p bra W%=;\n}" ::"r"(mb), "r"(parity)
                 : "memory");
#endif
}
__device__ __forceinline__ void ds4_fence_async_after_reads()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* How many clusters of cfg's shape (grid, block, cluster size, dynamic
 * shared memory) of kernel may be resident at once on cu's device: asked
 * once a device into cache[32] (all -1 at first; a device past 32 gets 0).
 * non_portable: a cluster of more than 8 blocks, which the kernel must be
 * allowed first (an attribute set per device). 0: none, or no answer (a
 * refusal is an answer: the error state it left is cleared, and only then). */
static inline int ds4_cluster_room(ds4_cuda *cu, const void *kernel, const cudaLaunchConfig_t *cfg, bool non_portable,
                                   int cache[32])
{
    if (cu->device < 0 || cu->device >= 32) return 0;
    int &r = cache[cu->device];
    if (r < 0) {
        int n = 0;
        cudaError_t e = non_portable ? cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1)
                                     : cudaSuccess;
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveClusters(&n, kernel, cfg);
        if (e != cudaSuccess) cudaGetLastError();
        r = e == cudaSuccess ? n : 0;
    }
    return r;
}

/* Whether launches carry the attribute: the device is sm_90+ and
 * DS4_CUDA_PDL is not 0 (set by ds4_cuda_create). */
extern int ds4_cuda_pdl_on;

/* Kernels this host thread launched through ds4_launch,
 * ds4_launch_clusters and the hyper-connection site's cluster launch, and
 * the backend's uploads and device copies: a hand-off that holds only
 * while nothing wrote device memory between its maker and its taker
 * (ds4_cuda's q8m) compares it. */
extern thread_local unsigned long long ds4_launch_seq;

/* kernel<<<grid, block, smem, stream>>>(args...) with the attribute when
 * ds4_cuda_pdl_on; a launch error is left for cudaGetLastError as with <<<>>>. */
template <typename... KArgs, typename... Args>
static inline void ds4_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                              Args &&...args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = ds4_cuda_pdl_on ? 1 : 0;
    ds4_kt_note_launch((const void *)kernel, ds4_kt_shape(grid.x, grid.y, grid.z, block.x), (const void *)stream);
    ds4_launch_seq++;
    (void)cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...);
}

/* A launch of grid in clusters of cl blocks (x) on cu's stream, into cfg
 * and its two attributes (attr): the cluster shape and, when
 * ds4_cuda_pdl_on, programmatic dependent launch (numAttrs 1 or 2). */
static inline void ds4_cluster_cfg(cudaLaunchConfig_t &cfg, cudaLaunchAttribute (&attr)[2], const ds4_cuda *cu,
                                   dim3 grid, unsigned threads, size_t smem, unsigned cl)
{
    cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = cu->stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cl;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = ds4_cuda_pdl_on ? 2 : 1;
}

/* kernel over a grid of `blocks` (x) in clusters of cl blocks (x), with
 * dynamic shared memory smem and, when ds4_cuda_pdl_on, programmatic
 * dependent launch. False, with nothing launched and the error state
 * cleared, where fewer than blocks / cl clusters may be resident at once
 * (ds4_cluster_room, asked once a device into room[32], all -1 at first)
 * or the launch is refused: the caller launches another form. */
template <typename... KArgs, typename... Args>
static inline bool ds4_launch_clusters(ds4_cuda *cu, void (*kernel)(KArgs...), unsigned blocks, unsigned threads,
                                       size_t smem, unsigned cl, int *room, Args &&...args)
{
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute attr[2];
    ds4_cluster_cfg(cfg, attr, cu, dim3(blocks), threads, smem, cl);
    const unsigned n_attrs = cfg.numAttrs;
    cfg.numAttrs = 1; /* the room asked for the cluster shape alone */
    if (ds4_cluster_room(cu, (const void *)kernel, &cfg, false, room) < (int)(blocks / cl)) return false;
    cfg.numAttrs = n_attrs;
    ds4_launch_seq++;
    if (cudaLaunchKernelEx(&cfg, kernel, static_cast<Args &&>(args)...) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    ds4_kt_note_launch((const void *)kernel, ds4_kt_shape(blocks, 1, 1, threads), (const void *)cu->stream);
    return true;
}

/* A default-off switch read from the environment once: true only when
 * the variable starts with '1' (diagnostics and opt-in forms not yet
 * made the default). *cache starts at -1. */
static inline bool ds4_env_flag_on(const char *name, int *cache)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && e[0] == '1';
    }
    return *cache == 1;
}

/* A default-on switch read from the environment once: false only when
 * the variable starts with '0' (DS4_CUDA_Q8SPLIT=0 and the like, for A/B
 * runs). *cache starts at -1. */
static inline bool ds4_env_switch_on(const char *name, int *cache)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = !(e && e[0] == '0');
    }
    return *cache == 1;
}

/* DS4_CUDA_WSUMS=0: the float products that sum several values over a warp
 * (a batch's tokens, a warp's rows) take a butterfly each instead of
 * ds4_warp_sums (cuda_mq_device.cuh); the same bits, for A/B. */
static inline bool ds4_warp_sums_on(void)
{
    static int on = -1;
    return ds4_env_switch_on("DS4_CUDA_WSUMS", &on);
}

/* A switch of several values read from the environment once: the
 * variable's first character when it is one of `allowed` (digits), else
 * dflt. *cache starts at -1. */
static inline int ds4_env_choice(const char *name, int *cache, int dflt, const char *allowed)
{
    if (*cache < 0) {
        const char *e = getenv(name);
        *cache = e && e[0] && strchr(allowed, e[0]) ? e[0] - '0' : dflt;
    }
    return *cache;
}

/* A float's order image: a larger float, a larger unsigned (for selections
 * by integer compares, radix bins or warp reductions); -0 counts as +0,
 * which the float comparison calls equal. A finite value's image is never
 * 0. Shared by the indexer's top-k and the router's pick. */
__device__ __forceinline__ uint32_t ds4_order_key(float x)
{
    const uint32_t u = __float_as_uint(__fadd_rn(x, 0.0f));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* 16 weight bytes streamed past L1 (each is read once per product). */
__device__ __forceinline__ uint4 ds4_ld_stream16(const uint8_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* The decode matvec on split-layout Q8_0 copies (cuda_q8split.cu), taken by
 * cuda_mmvq.cu's launcher for dense and block-diagonal products when every
 * matrix has a copy. Epilogues as the int8 kernel's MQ_STORE / MQ_SWIGLU /
 * MQ_ADD (same numbers). */
enum { DS4_Q8S_STORE = 0, DS4_Q8S_SWIGLU = 1, DS4_Q8S_ADD = 2, DS4_Q8S_PAIR = 3 /* fused kernel only */ };
struct ds4_q8s_args {
    const void *w[2];          /* original device pointers (gate, up for SwiGLU) */
    int64_t rows, cols;        /* of one block (group) */
    int64_t n_group;           /* > 1: block-diagonal, slot s uses group s mod n_group */
    const uint8_t *act;        /* quantized Q8_0 activation rows */
    int64_t act_ld;
    float *y;
    int64_t y_tok_stride, y_slot_stride, n_slots;
    float clamp;
    int accumulate;
};
/* nt tokens (1-4 or 8) a weight pass, act rows act_ld apart; each token's
 * sums are the same for every nt. 1 when launched (launch errors are left
 * for cudaGetLastError), 0 when some matrix has no split copy or the shape
 * is not covered. */
int ds4_q8split_run(ds4_cuda *cu, const ds4_q8s_args *a, int nt, int epi);
/* 9-16 tokens in one weight pass on the int8 tensor cores
 * (cuda_q8split_mma.cu), each token's numbers those of its own one-token
 * product (ds4_q8split_fused_run), the activation quantized in the launch:
 * token t of group g (n_group > 1: block-diagonal, the group's rows from
 * row g * rows of the matrices) reads x + (t * n_group + g) * x_ld and
 * writes rows values from y + g * y_grp_stride + t * y_tok_stride. STORE,
 * ADD and SWIGLU as above; 16-row tiles, cols % 512 == 0, sm_80+, unless
 * DS4_CUDA_Q8S_MMA=0. 1 when launched, 0 when not covered. */
struct ds4_q8m_args {
    const void *w[2];
    int64_t rows, cols, n_group;
    const float *x;
    int64_t x_ld;
    float *y;
    int64_t y_tok_stride, y_grp_stride;
    int nt;
    float clamp;
    int accumulate;
};
int ds4_q8split_mma_run(ds4_cuda *cu, const ds4_q8m_args *a, int epi);
/* a1's and a2's products (stored, 9-16 tokens of one x on two matrices of
 * its width: q_a and kv of a batched step) with x quantized once, each
 * bit for bit its own ds4_q8split_mma_run; 0 when not covered. With
 * launch = 0 only whether it is covered. */
int ds4_q8split_mma_pair(ds4_cuda *cu, const ds4_q8m_args *a1, const ds4_q8m_args *a2, int launch);

/* The int8 matvec's activation buffer (cu->act) of at least need bytes,
 * grown as its quantizer grows it (cuda_mmvq.cu). */
ds4_status ds4_mq_act_reserve(ds4_cuda *cu, size_t need, uint8_t **buf);

/* The split copy of the Q8_0 matrix whose original starts at d_w, with at
 * least rows_needed rows of cols values (its scale run follows at
 * split + total_rows * cols), and its row count; NULL when none. */
const uint8_t *ds4_q8split_find(int device, const void *d_w, int64_t rows_needed, int64_t cols, int64_t *rows);

/* The prefill GEMM's resident bf16 copies (cuda_gemm_bf16copy.cu): the
 * copy of the Q8_0 matrix at d_w (rows x cols, what the GEMM's
 * dequantization writes), or NULL when it has none. */
const __nv_bfloat16 *ds4_bf16copy_find(int device, const void *d_w, int64_t rows, int64_t cols);

/* The GEMM's dequantization of rows x cols of d_w into bf16 (cuda_gemm.cu). */
ds4_status ds4_cuda_dequantize_bf16(ds4_cuda *cu, ds4_type type, const void *d_w, int64_t rows, int64_t cols,
                                    __nv_bfloat16 *d_out);

/* One token's decode matvec on split-layout copies with the activation
 * quantized inside the kernel (cuda_q8split_fused.cu): no quantizer launch,
 * and the first weight loads are issued before the kernel waits for its
 * predecessor. Slot s (of n_slots) reads x + s * x_ld and writes
 * y + s * y_slot_stride; n_group > 1: block-diagonal as ds4_q8s_args. */
struct ds4_q8f_args {
    const void *w[2];
    int64_t rows, cols, n_group;
    const float *x;
    int64_t x_ld;
    float *y;
    int64_t y_slot_stride, n_slots;
    float clamp;
    int accumulate;
    /* norm_w (F32, cols values) or NULL: ds4_q8split_fused_norm only */
    const float *norm_w;
    float norm_eps;
};
/* 1 when launched, 0 when not covered (no split copy, shape, alignment,
 * DS4_CUDA_Q8FUSE=0): the caller then quantizes and takes the other paths. */
int ds4_q8split_fused_run(ds4_cuda *cu, const ds4_q8f_args *a, int epi);
/* h's buffers for n values (false: none, or asked for during a graph
 * recording, where nothing may be allocated: the WARM step before it
 * sizes them); a new buffer bumps mem_gen. */
bool ds4_q8_handoff_reserve(ds4_cuda *cu, ds4_q8_handoff *h, int64_t n);
/* Whether a norm of nt rows of n (a batched step's q_a norm) should store
 * its rows' fragment-order Q8_0 blocks for the next tensor-core product
 * (ds4_cuda's q8m; cuda_q8split_mma.cu): that product takes them. */
bool ds4_q8m_norm_takes(const ds4_cuda *cu, int64_t nt, int64_t n);
/* The same for a batched step's attention combine (n: a token's output
 * width) and o_a */
bool ds4_q8m_comb_takes(const ds4_cuda *cu, int64_t nt, int64_t n);
/* The buffer a maker of fragment-order blocks of n values a token writes
 * (ds4_cuda's q8m: the one not on offer), NULL where it cannot be had;
 * then, once the maker's launch is issued, its offer of y (nt tokens). */
ds4_q8_handoff *ds4_q8m_maker(ds4_cuda *cu, int64_t n);
void ds4_q8m_offer(ds4_cuda *cu, ds4_q8_handoff *h, const float *y, int64_t n, int nt);
/* Whether a batched o_a stores its outputs' blocks for o_b (q8m_want) */
bool ds4_q8m_oa_on(void);
/* Whether a batched step's sites store their blocks (DS4_CUDA_Q8M_SITE) */
bool ds4_q8m_site_on(void);
/* ops.h attention_out_project hands o_a the combine's Q8_0 blocks (on
 * unless DS4_CUDA_Q8_HANDOFF_A=0) */
bool ds4_q8_handoff_a_on(void);
/* DS4_CUDA_Q8_HANDOFF_S=1 (opt-in until measured): ops.h sublayer_input
 * hands the sublayer's products the site's Q8_0 blocks */
bool ds4_q8_handoff_s_on(void);
/* y = W rmsnorm(x) (a->norm_w set, one slot of 1024, stored: the rmsnorm
 * op's bits, then the product's), x left as it is. 1 when covered (and
 * launched with launch = 1), 0 when not (as above, or no norm_w). */
int ds4_q8split_fused_norm(ds4_cuda *cu, const ds4_q8f_args *a, int launch);
/* Two matrices on the same token x (cols values), in one launch:
 * y1 = W1 x (rows1), y2 = W2 x (rows2), each bit for bit its own STORE
 * launch. 1 when launched, 0 when not covered (as above). With launch = 0
 * only whether it is covered. */
int ds4_q8split_fused_pair(ds4_cuda *cu, const void *w1, int64_t rows1, float *y1, const void *w2, int64_t rows2,
                           float *y2, int64_t cols, const float *x, int launch);

/* ---- routed experts of a prefill chunk, grouped by expert ---------------
 * (cuda_moe_grouped.cu): each expert's weights are read once per group of
 * up to 4 of its tokens instead of once per (token, expert) slot. */
struct ds4_mq_group {
    int32_t expert, first, n, pad; /* n rows (<= the group size) from row `first` of the expert-sorted slots */
};
/* The same on the int8 tensor cores (cuda_moe_mma.cu, sm_80+): groups of
 * up to ds4_cuda_moe_mma_group_tokens() tokens, IQ2_XXS gate/up and Q2_K
 * down at the shapes ds4_cuda_moe_mma_covers() accepts (DS4_CUDA_MOE_MMA=0:
 * never); each (row, token) product is the CPU scalar kernel's. act rows:
 * Q8_K, act_ld bytes apart, with 7 rows to spare past the last; for the
 * gate/up with d_tok set, a row a token instead, slot s reading row
 * d_tok[s] / tok_div. */
extern "C" int ds4_cuda_moe_mma_group_tokens(void);
extern "C" bool ds4_cuda_moe_mma_covers(ds4_cuda *cu, ds4_type gu_type, ds4_type down_type, int64_t D, int64_t F);
extern "C" ds4_status ds4_cuda_moe_mma_swiglu(ds4_cuda *cu, const void *d_gate, const void *d_up, int64_t F,
                                              int64_t D, const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                              int64_t max_groups, const void *d_act, int64_t act_ld, float *d_h,
                                              float clamp, const int32_t *d_tok, int tok_div);
extern "C" ds4_status ds4_cuda_moe_mma_down(ds4_cuda *cu, const void *d_down, int64_t D, int64_t F,
                                            const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                            int64_t max_groups, const void *d_act, int64_t act_ld, float *d_y);
/* Quantize n_rows rows as ds4_cuda_mmvq_quantize; out row r is x row
 * map[r] / map_div (map NULL: row r). */
extern "C" ds4_status ds4_cuda_mmvq_quantize_map(ds4_cuda *cu, ds4_type type, const float *d_x, int64_t x_ld,
                                                 const int32_t *d_map, int map_div, int64_t n_rows, int64_t cols,
                                                 void *d_out);
/* y row (first + t) = W_e (x) act row (first + t) for each token group of
 * *d_n_groups (at most max_groups), epilogue DS4_Q8S_STORE or
 * DS4_Q8S_SWIGLU (d_w2 = up). Activation rows are the quantizer's. */
extern "C" ds4_status ds4_cuda_mmvq_groups(ds4_cuda *cu, ds4_type type, const void *d_w, const void *d_w2,
                                           int64_t rows, int64_t cols, int64_t expert_bytes, int64_t n_expert,
                                           const ds4_mq_group *d_groups, const int32_t *d_n_groups,
                                           int64_t max_groups, const void *d_act, float *d_y, int64_t y_ld, int epi,
                                           float clamp);
/* The whole routed-expert FFN of T tokens (k experts each, ids sel[T * k],
 * weights w[T * k]) on the grouped products: out (+)= sum over a token's
 * experts in ascending id of w * down(swiglu(gate x, up x)), the decode
 * kernels' numbers token by token. Returns DS4_ERR_UNSUPPORTED (nothing
 * launched) when the shapes or types are not covered. scratch: at least
 * ds4_cuda_moe_grouped_scratch bytes of device memory. */
size_t ds4_cuda_moe_grouped_scratch(ds4_type gu_type, ds4_type down_type, int64_t D, int64_t F, int64_t E, int T,
                                    int k);
ds4_status ds4_cuda_moe_grouped(ds4_cuda *cu, ds4_type gu_type, const void *d_gate, const void *d_up,
                                ds4_type down_type, const void *d_down, int64_t D, int64_t F, int64_t E,
                                const int32_t *d_sel, const float *d_w, int T, int k, const float *d_x, float clamp,
                                float *d_out, int accumulate, void *d_scratch, size_t scratch_bytes);

#endif
