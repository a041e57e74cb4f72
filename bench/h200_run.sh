#!/usr/bin/env bash
# h200_run.sh - one GPU session's checks and measurements in one command,
# with binaries built elsewhere (bench/h200_pack.sh makes the package: the
# programs, the GPU-side test binaries and the few shared libraries they
# link beyond the CUDA toolkit), run from the repository root.
#
#   PKG=.devwork/pkg OUT=outdir bench/h200_run.sh [STEP ...]
#
# Steps (default: tests kernels model exact):
#   tests     the GPU test binaries; again with DS4_CUDA_MMVQ=0 (the f32
#             matvec), so both kernel paths are checked
#   kernels   ds4-gpubench kernel table, int8 matvec on and off
#   l2probe   ds4-gpubench --l2probe: whether 8-48 MB of weights wait in L2
#             (plainly, evict_last, the copy engine's prefetch) through 26 MB
#             of other reads; CSV in l2probe.csv (a few seconds)
#   model     8-layer Flash-shaped synthetic (16 experts): ds4-gpubench
#             --model with each configuration of $CFGS (default "mmvq0 mmvq1":
#             DS4_CUDA_MMVQ=0 / 1; add e.g. attn0 for DS4_CUDA_ATTN=0)
#   exact     CPU vs CUDA logits on the same synthetic, 512 positions
#             (256 prefilled, 256 decoded): top-1 agreement, max |dlogit|;
#             with EXACT_SHARE=F also on a synthetic whose routed experts
#             share F of their blocks; each model's floor first (the CPU
#             against itself on a copy with one weight one ulp off)
#   same      CUDA logits bit for bit equal with each switch of $SAME_CFGS
#             and with the defaults (8-layer synthetic, 512 positions;
#             $SAME_REPEAT x 512 with SAME_REPEAT > 1, past 2048 positions)
#   (tests and same: a configuration of several switches that fails is
#   bisected in the same call, each switch alone, while BISECT_UNTIL
#   seconds, default 420, have not passed; BISECT=0 turns that off)
#   full      the full-size synthetic Flash q2 (bench/h200_fullsize.sh; on a
#             card under 100 GB cut to 30 of its 43 layers, below):
#             ds4-bench over CTX_START..CTX_MAX for each of $FULL_CFGS
#   ncudetail ncu --set full (every section) on the decode kernels named by
#             $NCU_KERNELS, $NCU_DCOUNT launches after $NCU_DSKIP matching
#             ones (8-layer model, or $NCU_MODEL with $NCU_CACHE=all to flush
#             caches; $SHM/syn8e.gguf, SHM default /dev/shm, is made when named; $NCU_ARGS the
#             ds4-gpubench arguments, default "--prefill 8 --decode 16"):
#             stall reasons, occupancy, bank conflicts
#   layerprof 8 layers with all 256 experts (one full-size layer's reads per
#             token): the replayed step timed, then ncu times every kernel of a
#             few decode steps alone, caches flushed first (lp_ncu_CFG.csv for
#             each of $LP_NCU_CFGS, default new); the binary's SASS (sass.txt.gz)
#   batchprof per-op wall times of 16 batched sessions' decode steps on the
#             8-layer, 256-expert model (DS4_CUDA_PROFILE=1), against one session
#   prefillprof where a prefill's GPU time goes: the 8-layer, 256-expert
#             model prefilling $PP_TOKENS (2048) tokens in chunks of $PP_CHUNK (512), timed
#             with each configuration of $PP_CFGS (default new), per-op
#             wall times (DS4_CUDA_PROFILE=1), then ncu's per-kernel GPU times
#             of about one chunk ($PP_NCU_SKIP launches skipped, $PP_NCU_COUNT timed,
#             a prefill of $PP_NCU_PREFILL tokens)
#   prefill2  the 8-layer model prefilled in four 2048-token steps (lazy
#             and eager module loading): whether the first pays one-time costs
#   prefillops the same four steps with each op's wall time (DS4_CUDA_PROFILE=2),
#             per row (scripts/prof_rows.py): which ops the first prefills pay for
#   prefilln  after --warmup, two 1000-token steps with each op's time: whether a
#             new step size pays a first-use cost again
#   batchncu  a batched decode step of 16 sessions (8-layer, 256-expert
#             model) kernel by kernel under ncu, against its wall time
#   batchdetail ncu --set full on that step's kernels named by $BD_KERNELS
#             (default the batched experts and the dense tensor-core pass)
#             (BD_SOURCE=1: also each kernel's SASS with its stall samples,
#             ncu_bdetail_sass.csv.gz; BD_KEEP=1 keeps the report)
#   kncu      one kernel (name regex $KN_KERNEL) under each configuration of
#             $KN_CFGS, ncu with caches flushed, in batchncu's run
#             ($KN_BATCH=1: one session's decode): the last $KN_LAST launches
#   server    ds4-server on the full-size synthetic (cut as for full; --backend cuda, --parallel
#             $SRV_PARALLEL, default 16; --ctx $SRV_CTX, 4096; --warmup) under
#             scripts/parallel_bench.py: $SRV_CLIENTS (1,16) streaming clients,
#             each $SRV_REQUESTS (2) greedy requests of $SRV_TOKENS (128) tokens,
#             $SRV_ROUNDS (2) rounds, for each configuration of $SRV_CFGS; the
#             aggregate tokens/s beside ds4-bench's (`full` in the same call);
#             first a prompt of ~$SRV_LONG (8000) tokens timed, then again
#             on one slot with each --prefill-chunk of $SRV_CHUNKS (128 2048)
#   streamtests  the VRAM expert cache's exactness tests (test_cuda_expert_cache
#             and tests/test_cuda_expert_cache.sh: logits byte-identical at
#             every budget)
#   stream    the VRAM expert cache on the full-size file (bench/h200_stream.sh):
#             resident vs --gpu-expert-cache $BUDGETS, PCIe bandwidth, stream.csv
# A configuration is a name made of switches joined by '+': mmvqN sets
# DS4_CUDA_MMVQ=N, attnN DS4_CUDA_ATTN=N, idxN DS4_CUDA_INDEXER=N, graphN
# DS4_CUDA_GRAPH=N, pipeN DS4_CUDA_MMVQ_PIPE=N, fmvN DS4_CUDA_FMV=N, pdlN
# DS4_CUDA_PDL=N, q8sN DS4_CUDA_Q8SPLIT=N, q8fN DS4_CUDA_Q8FUSE=N, moegN
# DS4_CUDA_MOE_GROUPED=N, sfmvN DS4_CUDA_SMALL_FMV=N, iq2rN DS4_CUDA_IQ2_REP=N, rmsrN
# DS4_CUDA_RMS_REG=N, hcrN DS4_CUDA_HC_REG=N, fuseN DS4_CUDA_FUSE=N, moeqxN
# DS4_CUDA_MOE_QX=N, iq2leanN DS4_CUDA_IQ2_LEAN=N, gfpN DS4_CUDA_GRAPH_FP=N,
# moe1N DS4_CUDA_MOE1=N, moe1cX DS4_CUDA_MOE1_CFG=X, moe1dX
# DS4_CUDA_MOE1_DCFG=X (X: 16x3 for either, 24x2 for the down), q8fdbN DS4_CUDA_Q8F_DB=N,
# hccN DS4_CUDA_HC_CLUSTER=N, fattnN DS4_CUDA_FUSE_ATTN=N, rfuseN
# DS4_CUDA_ROUTER_FUSE=N, mmaN DS4_CUDA_MOE_MMA=N, mgminN DS4_CUDA_MOE_GROUP_MIN=N,
# compparN DS4_CUDA_COMP_PAR=N,
# ftallN DS4_CUDA_FMV_TALL=N, ftalltcN DS4_CUDA_FMV_TALL_TC=N, attntcN DS4_CUDA_ATTN_TC=N, istcN DS4_CUDA_INDEXER_TC=N, mmastN DS4_CUDA_MOE_MMA_ST=N (N 2 or 3), sseqN DS4_CUDA_STATE_SEQS=N,
# bf16copyN DS4_CUDA_BF16COPY=N, at64N DS4_CUDA_ATTN_TC64=N, hcpost4N DS4_CUDA_HC_POST4=N,
# hccoefN DS4_CUDA_HC_COEF=N, hchalfN DS4_CUDA_HC_HALF=N, qatwarpN DS4_CUDA_QAT_WARP=N,
# mgatherN DS4_CUDA_MOE_GATHER=N, mbatchN DS4_CUDA_MOE_BATCH=N, mbcfgX DS4_CUDA_MOE_BATCH_CFG=X (16x2, 16x3), hccpN DS4_CUDA_HCC_PREFILL=N, q8mmaN DS4_CUDA_Q8S_MMA=N, q8mstN DS4_CUDA_Q8M_STREAM=N, mbarN DS4_CUDA_MOE_BATCH_AR=N, aheadN DS4_CUDA_MOE_AHEAD=N, pinN DS4_CUDA_HOST_PIN=N, fmvxrN DS4_CUDA_FMV_XR=N, sideN DS4_CUDA_SIDE=N, atcsN DS4_CUDA_ATTN_TC_SPLIT=N, attnpN
# DS4_CUDA_ATTN_PREFILL=N, saheadN DS4_CUDA_STEP_AHEAD=N, hcctpcN DS4_CUDA_HCC_TPC=N (N 1 or 2),
# ktime DS4_CUDA_KTIME=1 (in-graph kernel times on stderr; with side0+ahead0
# each kernel's own), attn2 DS4_CUDA_ATTN_TWICE=1 (the split attention launched twice),
# narrowN DS4_CUDA_ATTN_NARROW=N (0: a decode split walk in blocks of 64 heads, not 16),
# r16N DS4_CUDA_ATTN_R16=N (split chunks of 16 rows), comb4N DS4_CUDA_ATTN_COMB4=N (the combine in 4 parts),
# cearlyN DS4_CUDA_ATTN_COMB_EARLY=N (the combine's constants before its wait, no row count),
# cpreN DS4_CUDA_ATTN_COMB_PRE=N (the early combine's rotation before its wait, its partials' loads without branches),
# isnN DS4_CUDA_IS_NARROW=N (the indexer's scores in blocks of 4 or 8 keys when 32 leave SMs idle),
# isdtcN DS4_CUDA_IS_DEC_TC=N (1, opt-in: a decode query's indexer scores on the int8 tensor cores, each block preparing its rows),
# iqselN DS4_CUDA_IQ2_SEL=N (1, opt-in: one token's routed gate+up IQ2_XXS from the selector tables; on the
# 256-byte grid rows unless row2560 or iqprmt0),
# iqprmtN DS4_CUDA_IQ2_PRMT=N (0: the batch's gate+up off the 256-byte rows in the selector form SEL 1, not through the raw prmt),
# gdendsN DS4_CUDA_MOE_DOWN_ENDS=N (0: the batch's routed down from registers loads its output values at their use),
# row256N DS4_CUDA_IQ2_ROW256=N (0: the batch's gate+up on tables of 128-byte rows, ds4_gb_kernel, not ds4_gb256_kernel),
# gdpairN DS4_CUDA_MOE_DOWN_PAIR=N (0: the batch's routed down by single warps, six activations a warp, not by warp pairs),
# iqselbN DS4_CUDA_IQ2_SEL_BATCH=N (0: the batch's gate+up from the lean tables),
# q8hoN DS4_CUDA_Q8_HANDOFF=N (0: o_b quantizes o_a's outputs itself, where one token's o_a hands it their Q8_0 blocks),
# q8hsN DS4_CUDA_Q8_HANDOFF_S=N (1, opt-in: one token's hyper-connection site hands the sublayer's products its input's Q8_0 blocks),
# q8haN DS4_CUDA_Q8_HANDOFF_A=N (0: o_a quantizes the attention's output itself, where one token's combine hands it its Q8_0 blocks),
# qbropeN DS4_CUDA_QB_ROPE=N (N 0, 2 or 3) (0: the head norms in a launch of their own, where q_b's launch does
# them, ops.h query_rope; 2, opt-in: there by clusters of a head's four blocks; 3, opt-in: those clusters'
# exchange by pushes),
# q8mrtN DS4_CUDA_Q8M_RT=N (N 1 or 3) (1: the batch's streamed tensor-core products in tiles of 16 rows, where
# the default takes 32 where each SM still gets a tile; 3: 32 wherever the rows split into them),
# hccsN DS4_CUDA_HCC_SPLIT=N (N 0 or 2) (0: one token's hyper-connection site over 8 blocks, where the default
# takes a cluster of 16, each with half the mixing rows; 2, opt-in: a batch's sites over 16 too),
# hcpushN DS4_CUDA_HCC_PUSH=N (0: the hyper-connection site's two cluster exchanges by cluster barriers and
# remote loads, where the default pushes into each block's shared memory, counted off a transaction barrier),
# rregN DS4_CUDA_ROUTE_REG=N (the router's pick from registers), qbnN DS4_CUDA_QB_NORM=N (the q_a norm
# inside q_b's and the indexer's q_b products), pairkN DS4_CUDA_Q8F_PAIRK=N (o_b's rows of 8192 in warp pairs),
# sidxqN DS4_CUDA_SIDE_IDXQ=N (a CSA layer's indexer query products before the side fork),
# sidxwN DS4_CUDA_SIDE_IDXW=N (with those first, its head weights beside the compressors),
# ropeseqsN DS4_CUDA_ROPE_SEQS=N (0: a batched step's indexer query rows roped a launch a sequence, where the default takes one launch),
# q8moneN DS4_CUDA_Q8M_ONE=N (0: a batched step's q_a and kv products in two launches, where the default takes one),
# q8mnormN DS4_CUDA_Q8M_NORM=N (0: a batched step's q_b quantizes the q_a norm's rows itself, where the default
# takes the norm's fragment-order blocks), q8mcombN DS4_CUDA_Q8M_COMB=N (0: a batched step's o_a quantizes the
# attention's output itself, where the default takes the combine's blocks), q8moaN DS4_CUDA_Q8M_OA=N (0: a batched
# step's o_b quantizes o_a's outputs itself, where the default takes o_a's blocks), q8msiteN DS4_CUDA_Q8M_SITE=N
# (0: a batched step's q_a/kv and shared expert quantize the sublayer input themselves, where the default takes
# the site's blocks),
# iqropeN DS4_CUDA_IDX_QROPE=N (N 0 or 2) (0: a CSA layer's indexer q_b, RoPE and QAT of one token in three launches, where the default
# takes one; 2, opt-in: that launch over clusters of two blocks a head),
# comptwoN DS4_CUDA_COMP_TWO=N (0: a CSA layer's two compressors of one token in four launches, where the default takes two),
# q8fbulkN DS4_CUDA_Q8F_BULK=N (N 2 or 3) (one token's Q8_0 products streamed through a ring of N stages a warp
# filled by bulk copies, the first N batches asked for before the programmatic-launch wait; 0, the default:
# the register forms),
# q8fblongN DS4_CUDA_Q8F_BULK_LONG=N (with q8fbulkN, the ring only for o_b's rows of 8192),
# moeearlyN DS4_CUDA_MOE_EARLY=N (0: the routed kernels' reads of earlier launches after their wait),
# sfoldN DS4_CUDA_SHARED_FOLD=N (the shared expert's result added in the routed down's store),
# sinklN DS4_CUDA_HC_SINK_LATE=N (a decode site's Sinkhorn run by a later kernel's extra block),
# wsumsN DS4_CUDA_WSUMS=N (0: the batch's float products and the indexer's queries sum a warp's values by a
# butterfly each, where the default shares the butterflies' steps, ds4_warp_sums),
# q8maheadN DS4_CUDA_Q8M_AHEAD=N (N 0 or 2) (the batch's 16-warp tensor-core products, q_a / kv and the
# shared gate+up, with N blocks of 16 rows' loads out at once a warp: 0 the first form; the default 4),
# gdregsN DS4_CUDA_MOE_DOWN_REGS=N (0: the batch's routed down reads its activations from shared memory,
# where the default holds each warp's token's in registers, cuda_moe_down_regs.cu),
# warm (ds4-bench --warmup), hostpick (ds4-bench --host-pick: the greedy pick on
# the host, for A/B against the device pick), batchN
# BATCH=N (the full step's batched sessions), chunk512 / chunk2048 --prefill-chunk 512 / 2048 in
# the full step, ctx8k / ctx32k the full step's
# last frontier ("new" = the defaults). Logs go to $OUT/logs.tgz (the
# device tool brings back few files; with OUT_ONE=1 the CSV files too), the
# summary to $OUT/summary.txt and stdout.
set -u
PKG=${PKG:-.devwork/pkg}
OUT=${OUT:-h200-out}
SHM=${SHM:-/dev/shm} # scratch: models, logits (tests/test_h200_run_bisect.sh points it elsewhere)
export LD_LIBRARY_PATH="$PWD/$PKG/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$PKG/bin
T=$PKG/tests
steps=${*:-tests kernels model exact}
t_start=$(date +%s)
summary=$OUT/summary.txt
say() { echo "$*" | tee -a "$summary"; }
# env assignments for a configuration name (see above)
cfg_env() {
    local out="" part
    for part in ${1//+/ }; do
        case $part in
        mmvq[01]) out="$out DS4_CUDA_MMVQ=${part#mmvq}" ;;
        attn[01]) out="$out DS4_CUDA_ATTN=${part#attn}" ;;
        idx[01]) out="$out DS4_CUDA_INDEXER=${part#idx}" ;;
        graph[01]) out="$out DS4_CUDA_GRAPH=${part#graph}" ;;
        pipe[01]) out="$out DS4_CUDA_MMVQ_PIPE=${part#pipe}" ;;
        fmv[01]) out="$out DS4_CUDA_FMV=${part#fmv}" ;;
        pdl[01]) out="$out DS4_CUDA_PDL=${part#pdl}" ;;
        q8s[01]) out="$out DS4_CUDA_Q8SPLIT=${part#q8s}" ;;
        q8f[01]) out="$out DS4_CUDA_Q8FUSE=${part#q8f}" ;;
        moeg[01]) out="$out DS4_CUDA_MOE_GROUPED=${part#moeg}" ;;
        sfmv[01]) out="$out DS4_CUDA_SMALL_FMV=${part#sfmv}" ;;
        iq2r[01]) out="$out DS4_CUDA_IQ2_REP=${part#iq2r}" ;;
        rmsr[01]) out="$out DS4_CUDA_RMS_REG=${part#rmsr}" ;;
        hcr[01]) out="$out DS4_CUDA_HC_REG=${part#hcr}" ;;
        fuse[01]) out="$out DS4_CUDA_FUSE=${part#fuse}" ;;
        moeqx[01]) out="$out DS4_CUDA_MOE_QX=${part#moeqx}" ;;
        iq2lean[01]) out="$out DS4_CUDA_IQ2_LEAN=${part#iq2lean}" ;;
        gfp[01]) out="$out DS4_CUDA_GRAPH_FP=${part#gfp}" ;;
        moe1[01]) out="$out DS4_CUDA_MOE1=${part#moe1}" ;;
        moe1c*) out="$out DS4_CUDA_MOE1_CFG=${part#moe1c}" ;;
        q8fdb[01]) out="$out DS4_CUDA_Q8F_DB=${part#q8fdb}" ;;
        moe1d*) out="$out DS4_CUDA_MOE1_DCFG=${part#moe1d}" ;;
        hcc[01]) out="$out DS4_CUDA_HC_CLUSTER=${part#hcc}" ;;
        fattn[01]) out="$out DS4_CUDA_FUSE_ATTN=${part#fattn}" ;;
        sseq[01]) out="$out DS4_CUDA_STATE_SEQS=${part#sseq}" ;;
        hccp[01]) out="$out DS4_CUDA_HCC_PREFILL=${part#hccp}" ;;
        q8mma[01]) out="$out DS4_CUDA_Q8S_MMA=${part#q8mma}" ;;
        q8mst[01]) out="$out DS4_CUDA_Q8M_STREAM=${part#q8mst}" ;;
        mbar[01]) out="$out DS4_CUDA_MOE_BATCH_AR=${part#mbar}" ;;
        ahead[01]) out="$out DS4_CUDA_MOE_AHEAD=${part#ahead}" ;;
        pin[01]) out="$out DS4_CUDA_HOST_PIN=${part#pin}" ;;
        fmvxr[01]) out="$out DS4_CUDA_FMV_XR=${part#fmvxr}" ;;
        side[01]) out="$out DS4_CUDA_SIDE=${part#side}" ;;
        atcs[01]) out="$out DS4_CUDA_ATTN_TC_SPLIT=${part#atcs}" ;;
        attnp[0-9]*) out="$out DS4_CUDA_ATTN_PREFILL=${part#attnp}" ;;
        rfuse[01]) out="$out DS4_CUDA_ROUTER_FUSE=${part#rfuse}" ;;
        mma[01]) out="$out DS4_CUDA_MOE_MMA=${part#mma}" ;;
        mgmin[0-9]*) out="$out DS4_CUDA_MOE_GROUP_MIN=${part#mgmin}" ;;
        comppar[01]) out="$out DS4_CUDA_COMP_PAR=${part#comppar}" ;;
        ftall[01]) out="$out DS4_CUDA_FMV_TALL=${part#ftall}" ;;
        ftalltc[01]) out="$out DS4_CUDA_FMV_TALL_TC=${part#ftalltc}" ;;
        attntc[01]) out="$out DS4_CUDA_ATTN_TC=${part#attntc}" ;;
        istc[01]) out="$out DS4_CUDA_INDEXER_TC=${part#istc}" ;;
        mmast[23]) out="$out DS4_CUDA_MOE_MMA_ST=${part#mmast}" ;;
        bf16copy[01]) out="$out DS4_CUDA_BF16COPY=${part#bf16copy}" ;;
        at64[01]) out="$out DS4_CUDA_ATTN_TC64=${part#at64}" ;;
        hcpost4[01]) out="$out DS4_CUDA_HC_POST4=${part#hcpost4}" ;;
        hccoef[01]) out="$out DS4_CUDA_HC_COEF=${part#hccoef}" ;;
        hchalf[01]) out="$out DS4_CUDA_HC_HALF=${part#hchalf}" ;;
        qatwarp[01]) out="$out DS4_CUDA_QAT_WARP=${part#qatwarp}" ;;
        mgather[01]) out="$out DS4_CUDA_MOE_GATHER=${part#mgather}" ;;
        mbatch[01]) out="$out DS4_CUDA_MOE_BATCH=${part#mbatch}" ;;
        mbcfg*) out="$out DS4_CUDA_MOE_BATCH_CFG=${part#mbcfg}" ;;
        sahead[01]) out="$out DS4_CUDA_STEP_AHEAD=${part#sahead}" ;;
        hcctpc[12]) out="$out DS4_CUDA_HCC_TPC=${part#hcctpc}" ;;
        q8ho[01]) out="$out DS4_CUDA_Q8_HANDOFF=${part#q8ho}" ;;
        q8ha[01]) out="$out DS4_CUDA_Q8_HANDOFF_A=${part#q8ha}" ;;
        q8hs[01]) out="$out DS4_CUDA_Q8_HANDOFF_S=${part#q8hs}" ;;
        qbrope[0123]) out="$out DS4_CUDA_QB_ROPE=${part#qbrope}" ;;
        q8mrt[123]) out="$out DS4_CUDA_Q8M_RT=${part#q8mrt}" ;;
        hccs[012]) out="$out DS4_CUDA_HCC_SPLIT=${part#hccs}" ;;
        hcpush[01]) out="$out DS4_CUDA_HCC_PUSH=${part#hcpush}" ;;
        ktime) out="$out DS4_CUDA_KTIME=1" ;;
        attn2) out="$out DS4_CUDA_ATTN_TWICE=1" ;;
        narrow[01]) out="$out DS4_CUDA_ATTN_NARROW=${part#narrow}" ;;
        r16[01]) out="$out DS4_CUDA_ATTN_R16=${part#r16}" ;;
        comb4[01]) out="$out DS4_CUDA_ATTN_COMB4=${part#comb4}" ;;
        cearly[01]) out="$out DS4_CUDA_ATTN_COMB_EARLY=${part#cearly}" ;;
        cpre[01]) out="$out DS4_CUDA_ATTN_COMB_PRE=${part#cpre}" ;;
        isn[01]) out="$out DS4_CUDA_IS_NARROW=${part#isn}" ;;
        iqsel[01]) out="$out DS4_CUDA_IQ2_SEL=${part#iqsel}" ;;
        iqselb[01]) out="$out DS4_CUDA_IQ2_SEL_BATCH=${part#iqselb}" ;;
        isdtc[01]) out="$out DS4_CUDA_IS_DEC_TC=${part#isdtc}" ;;
        rreg[01]) out="$out DS4_CUDA_ROUTE_REG=${part#rreg}" ;;
        qbn[01]) out="$out DS4_CUDA_QB_NORM=${part#qbn}" ;;
        pairk[01]) out="$out DS4_CUDA_Q8F_PAIRK=${part#pairk}" ;;
        sidxq[01]) out="$out DS4_CUDA_SIDE_IDXQ=${part#sidxq}" ;;
        sidxw[01]) out="$out DS4_CUDA_SIDE_IDXW=${part#sidxw}" ;;
        ropeseqs[01]) out="$out DS4_CUDA_ROPE_SEQS=${part#ropeseqs}" ;;
        q8mone[01]) out="$out DS4_CUDA_Q8M_ONE=${part#q8mone}" ;;
        q8mnorm[01]) out="$out DS4_CUDA_Q8M_NORM=${part#q8mnorm}" ;;
        q8mcomb[01]) out="$out DS4_CUDA_Q8M_COMB=${part#q8mcomb}" ;;
        q8moa[01]) out="$out DS4_CUDA_Q8M_OA=${part#q8moa}" ;;
        q8msite[01]) out="$out DS4_CUDA_Q8M_SITE=${part#q8msite}" ;;
        iqrope[012]) out="$out DS4_CUDA_IDX_QROPE=${part#iqrope}" ;;
        comptwo[01]) out="$out DS4_CUDA_COMP_TWO=${part#comptwo}" ;;
        q8fbulk[0234]) out="$out DS4_CUDA_Q8F_BULK=${part#q8fbulk}" ;;
        q8fblong[01]) out="$out DS4_CUDA_Q8F_BULK_LONG=${part#q8fblong}" ;;
        moeearly[01]) out="$out DS4_CUDA_MOE_EARLY=${part#moeearly}" ;;
        sfold[01]) out="$out DS4_CUDA_SHARED_FOLD=${part#sfold}" ;;
        sinkl[01]) out="$out DS4_CUDA_HC_SINK_LATE=${part#sinkl}" ;;
        wsums[01]) out="$out DS4_CUDA_WSUMS=${part#wsums}" ;;
        q8mahead[024]) out="$out DS4_CUDA_Q8M_AHEAD=${part#q8mahead}" ;;
        gdregs[01]) out="$out DS4_CUDA_MOE_DOWN_REGS=${part#gdregs}" ;;
        iqprmt[01]) out="$out DS4_CUDA_IQ2_PRMT=${part#iqprmt}" ;;
        gdends[01]) out="$out DS4_CUDA_MOE_DOWN_ENDS=${part#gdends}" ;;
        row256[01]) out="$out DS4_CUDA_IQ2_ROW256=${part#row256}" ;;
        gdpair[01]) out="$out DS4_CUDA_MOE_DOWN_PAIR=${part#gdpair}" ;;
        batch*) out="$out BATCH=${part#batch}" ;;
        warm) out="$out WARMUP=1" ;;
        hostpick) out="$out HOST_PICK=1" ;;
        chunk512) out="$out PREFILL_CHUNK=512" ;;
        chunk2048) out="$out PREFILL_CHUNK=2048" ;;
        ctx8k) out="$out CTX_MAX=8192 STEP=6144" ;;
        ctx32k) out="$out CTX_MAX=32768 STEP=6144" ;;
        new | default) ;;
        *) out="$out DS4_UNKNOWN_SWITCH=$part" ;;
        esac
    done
    echo "$out"
}
# every configuration named must be made of known switches (a misspelt one
# would silently measure the defaults)
for c in ${TEST_CFGS:-} ${CFGS:-} ${EXACT_CFGS:-} ${SAME_CFGS:-} ${FULL_CFGS:-} ${LP_CFGS:-} ${LP_NCU_CFGS:-} ${PP_CFGS:-} ${KN_CFGS:-} ${SRV_CFGS:-}; do
    case $(cfg_env "$c") in
    *DS4_UNKNOWN_SWITCH=*) echo "h200_run.sh: configuration '$c' has an unknown switch: $(cfg_env "$c" | tr ' ' '\n' | sed -n 's/^DS4_UNKNOWN_SWITCH=//p')" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT" build/tests
: > "$summary"
fname() { echo "${1//+/-}"; } # '+' cannot come back from the device in a file name
timed_out() { [ "$1" = 124 ] && echo " (TIMED OUT: killed after its limit)"; } # timeout's status
# A configuration of several switches that fails: which of its switches does
# it alone? Each part is tried by itself while the call has time left
# (BISECT_UNTIL seconds since the start, default 420 of the device's 600;
# BISECT=0: never), so a failure costs no second call to locate.
bisect_time() { [ $(($(date +%s) - t_start)) -lt "${BISECT_UNTIL:-420}" ]; }
bisect_parts() { [ "${BISECT:-1}" != 0 ] && case $1 in *+*) echo "${1//+/ }" ;; esac; }
# the test binaries that failed in a run_tests.sh log (a FAIL line under
# its "== binary" header, or named as crashed)
failed_bins() {
    awk '/^== /{b=$2} /^FAIL/{if (b != "" && !(b in s)) {s[b]=1; print b}}
         /^crashed or bad exit:/{for (i = 4; i <= NF; i++) if (!($i in s)) {s[$i]=1; print $i}}' "$1"
}
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
say "gpu: $(tail -1 "$OUT/gpu.txt")"
# The full-size file (81 GiB) needs a card of more than 80 GB (an H200's
# 141). On a smaller card (an H100's 80 GB) the steps full and server take
# it cut to 30 of its 43 layers (57 GiB; 36 did not fit beside a session),
# unless SYNTH_ARGS is given; the summary says so, and such numbers compare
# configurations, not the H200's targets. (Not stream: a file larger than
# the card is what it measures.)
fit_args=()
gpu_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -dc 0-9)
if [ -z "${SYNTH_ARGS+x}" ] && [ -n "$gpu_mib" ] && [ "$gpu_mib" -lt 100000 ]; then
    fit_args=(SYNTH_ARGS="--layers 30" NEED_GIB="${NEED_GIB:-64}")
    case " $steps " in *" full "*|*" server "*)
        say "model: full and server take the full-size synthetic cut to 30 of its 43 layers (this card has $gpu_mib MiB; SYNTH_ARGS overrides)" ;;
    esac
fi

synth8() {
    [ -s $SHM/syn8.gguf ] && return
    "$B/ds4-quantize" --synthetic flash --layers 8 --n-experts 16 --out $SHM/syn8.gguf \
        --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > "$OUT/synth8.log" 2>&1
}
# the same with all 256 experts (a token reads what one full-size layer reads)
synth8e() {
    [ -s $SHM/syn8e.gguf ] && return
    "$B/ds4-quantize" --synthetic flash --layers 8 --out $SHM/syn8e.gguf \
        --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > "$OUT/synth8e.log" 2>&1
}

for s in $steps; do
    case $s in
    tests)
        all=""
        for t in test_cuda_decode test_cuda_kernels test_cuda_ops test_cuda_session test_cuda_moe test_ops \
                 test_model_golden test_decode_batch test_weight_share test_bench_model; do
            [ -x "$T/$t" ] && all="$all $T/$t"
        done
        # a kernel that hangs (an opt-in form never run before) must not
        # take the call's other steps with it: each run is bounded
        DS4_BIN_DIR=$B timeout "${TEST_TIMEOUT:-400}" tests/run_tests.sh $all > "$OUT/tests.log" 2>&1
        rc=$?
        say "tests (default): $(tail -1 "$OUT/tests.log")$(timed_out $rc)"
        grep -E "^FAIL|failed|error" "$OUT/tests.log" | head -20 | tee -a "$summary"
        gpu="$T/test_cuda_kernels $T/test_cuda_ops $T/test_cuda_session $T/test_cuda_moe $T/test_model_golden $T/test_decode_batch"
        for c in ${TEST_CFGS:-mmvq0}; do
            env $(cfg_env "$c") timeout "${TEST_TIMEOUT:-400}" tests/run_tests.sh $gpu > "$OUT/tests_$(fname $c).log" 2>&1
            rc=$?
            say "tests ($c): $(tail -1 "$OUT/tests_$(fname $c).log")$(timed_out $rc)"
            grep -E "^FAIL" "$OUT/tests_$(fname $c).log" | head -10 | tee -a "$summary"
            bins=$(failed_bins "$OUT/tests_$(fname $c).log" | tr '\n' ' ')
            for p in ${bins:+$(bisect_parts "$c")}; do
                bisect_time || { say "tests ($c): bisect stopped, out of time"; break; }
                env $(cfg_env "$p") timeout "${TEST_TIMEOUT:-400}" tests/run_tests.sh $bins \
                    > "$OUT/tests_$(fname $c)_by_$p.log" 2>&1
                rc=$?
                say "tests ($c) bisect: $p alone on$(for b in $bins; do printf ' %s' "${b##*/}"; done):" \
                    "$(tail -1 "$OUT/tests_$(fname $c)_by_$p.log")$(timed_out $rc)"
            done
        done
        ;;
    kernels)
        "$B/ds4-gpubench" > "$OUT/kernels.log" 2>&1
        DS4_CUDA_MMVQ=0 "$B/ds4-gpubench" > "$OUT/kernels_mmvq0.log" 2>&1
        say "kernels: see kernels.log / kernels_mmvq0.log"
        ;;
    l2probe)
        "$B/ds4-gpubench" --l2probe > "$OUT/l2probe.log" 2>&1
        rc=$?
        grep -E '^l2probe|^#' "$OUT/l2probe.log" > "$OUT/l2probe.csv"
        say "l2probe (rc $rc): $(grep -E '^l2probe,32,none,(cold|warm|bulk|warm_last\+other_first),' "$OUT/l2probe.log" | cut -d, -f4,5,7 | tr '\n' ' ')"
        ;;
    model)
        synth8
        for c in ${CFGS:-mmvq0 new}; do
            env $(cfg_env "$c") DS4_CUDA_GRAPH_VERBOSE=1 "$B/ds4-gpubench" \
                --model $SHM/syn8.gguf --prefill 512 --decode 128 > "$OUT/model_$(fname $c).log" 2>&1
            say "model 8L $c: $(grep -E 'decode' "$OUT/model_$(fname $c).log" | tr '\n' ' ')"
        done
        ;;
    exact)
        # on the 8-layer synthetic and, with EXACT_SHARE=F, on one whose
        # routed experts share that fraction of their blocks
        # (ds4-quantize --expert-share); first the model's own floor: the
        # CPU against the CPU on a copy with one norm weight moved by one
        # ulp (scripts/gguf_perturb.py)
        synth8
        models=$SHM/syn8.gguf
        if [ -n "${EXACT_SHARE:-}" ]; then
            [ -s $SHM/syn8s.gguf ] || "$B/ds4-quantize" --synthetic flash --layers 8 --n-experts 16 \
                --expert-share "$EXACT_SHARE" --out $SHM/syn8s.gguf \
                --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > "$OUT/synth8s.log" 2>&1
            models="$models $SHM/syn8s.gguf"
        fi
        ids=$PKG/ids512.txt
        for m in $models; do
            mn=$(basename "$m" .gguf)
            "$B/ds4" -m "$m" --cpu -t "$(nproc)" --token-ids "$ids" --decode-from 256 \
                --dump-logits $SHM/cpu.bin > "$OUT/exact_cpu_$mn.log" 2>&1
            python3 scripts/gguf_perturb.py "$m" $SHM/ulp.gguf blk.0.attn_norm.weight > /dev/null &&
                "$B/ds4" -m $SHM/ulp.gguf --cpu -t "$(nproc)" --token-ids "$ids" --decode-from 256 \
                    --dump-logits $SHM/cpu_ulp.bin > "$OUT/exact_cpu_ulp_$mn.log" 2>&1
            rm -f $SHM/ulp.gguf
            say "exact $mn: CPU vs CPU one ulp off: $(python3 scripts/compare_logits.py $SHM/cpu.bin \
                $SHM/cpu_ulp.bin 512 --from 256 2>&1 | tr '\n' ' ')"
            for c in ${EXACT_CFGS:-new mmvq0}; do
                for chunk in 128 16; do
                    rm -f $SHM/cuda.bin
                    env $(cfg_env "$c") timeout "${RUN_TIMEOUT:-240}" "$B/ds4" -m "$m" --cuda --token-ids "$ids" \
                        --prefill-chunk $chunk --decode-from 256 --dump-logits $SHM/cuda.bin \
                        > "$OUT/exact_cuda_${mn}_$(fname $c).log" 2>&1
                    say "exact $mn CPU vs CUDA ($c, prefill chunk $chunk): $(python3 scripts/compare_logits.py \
                        $SHM/cpu.bin $SHM/cuda.bin 512 --from 256 2>&1 | tr '\n' ' ')"
                done
            done
        done
        ;;
    same)
        # switches that must not change a bit: CUDA logits of 256 prefilled
        # and 256 decoded positions of the 8-layer synthetic with each of
        # $SAME_CFGS against the defaults
        # ($SAME_REPEAT > 1: the 512 ids that many times over, the last 256
        # decoded, so the prefill runs past 2048 positions, where the CSA
        # layers' indexer scores keys)
        synth8
        ids=$PKG/ids512.txt
        rep=${SAME_REPEAT:-1}
        if [ "$rep" -gt 1 ]; then
            for i in $(seq "$rep"); do cat "$PKG/ids512.txt"; echo; done | tr -s ' \n' ' ' > $SHM/same_ids.txt
            ids=$SHM/same_ids.txt
        fi
        from=$((512 * rep - 256))
        "$B/ds4" -m $SHM/syn8.gguf --cuda --token-ids "$ids" --decode-from $from \
            --dump-logits $SHM/same_new.bin > "$OUT/same_new.log" 2>&1
        for c in ${SAME_CFGS:-iq2lean0}; do
            rm -f $SHM/same_c.bin
            env $(cfg_env "$c") timeout "${RUN_TIMEOUT:-240}" "$B/ds4" -m $SHM/syn8.gguf --cuda --token-ids "$ids" \
                --decode-from $from --dump-logits $SHM/same_c.bin > "$OUT/same_$(fname $c).log" 2>&1
            if [ -s $SHM/same_c.bin ] && cmp -s $SHM/same_new.bin $SHM/same_c.bin; then
                say "same: $c gives the defaults' logits bit for bit ($(stat -c %s $SHM/same_c.bin) bytes)"
            else
                say "same: $c DIFFERS from the defaults: $(cmp $SHM/same_new.bin $SHM/same_c.bin 2>&1 | head -1)"
                for p in $(bisect_parts "$c"); do
                    bisect_time || { say "same ($c): bisect stopped, out of time"; break; }
                    rm -f $SHM/same_p.bin
                    env $(cfg_env "$p") timeout "${RUN_TIMEOUT:-240}" "$B/ds4" -m $SHM/syn8.gguf --cuda \
                        --token-ids "$ids" --decode-from $from --dump-logits $SHM/same_p.bin \
                        > "$OUT/same_$(fname $c)_by_$p.log" 2>&1
                    if [ -s $SHM/same_p.bin ] && cmp -s $SHM/same_new.bin $SHM/same_p.bin; then
                        say "same ($c) bisect: $p alone gives the defaults' bits"
                    else
                        say "same ($c) bisect: $p alone DIFFERS: $(cmp $SHM/same_new.bin $SHM/same_p.bin 2>&1 | head -1)"
                    fi
                done
            fi
        done
        ;;
    full)
        rm -f $SHM/syn8.gguf $SHM/syn8e.gguf $SHM/cpu.bin $SHM/cuda.bin $SHM/same_*.bin
        ln -sf "$PWD/$B/ds4-quantize" ./ds4-quantize
        ln -sf "$PWD/$B/ds4-bench" ./ds4-bench
        declare -A seen=()
        for c in ${FULL_CFGS:-new mmvq0}; do
            f=$(fname "$c")
            # a configuration named again (alternated A/B runs) keeps each run's files: -2, -3, ...
            seen[$f]=$(( ${seen[$f]:-0} + 1 ))
            [ "${seen[$f]}" -gt 1 ] && f="$f-${seen[$f]}"
            env "${fit_args[@]}" CTX_START=${CTX_START:-2048} CTX_MAX=${CTX_MAX:-2048} STEP=${STEP:-2048} GEN=${GEN:-64} \
                $(cfg_env "$c") DS4_CUDA_GRAPH_VERBOSE=1 timeout "${FULL_TIMEOUT:-300}" bench/h200_fullsize.sh \
                "$OUT/full_$f" > "$OUT/full_$f.log" 2>&1
            say "full $c: rc $? $(grep -E '^ds4-bench: (ctx [0-9]+: bandwidth|peak RSS)' "$OUT/full_$f/bench.log" 2>/dev/null | tail -3 | tr '\n' ' ')"
            say "$(grep -h "cuda graph" "$OUT/full_$f/bench.log" | sort | uniq -c | head -5)"
            say "$(cat "$OUT/full_$f/flash-q2.csv" 2>/dev/null)"
            cp "$OUT/full_$f/flash-q2.csv" "$OUT/full_$f.csv" 2>/dev/null
        done
        ;;
    server)
        # the real server on the full-size synthetic (the file `full` makes,
        # made here when no earlier step did): C streaming clients of greedy
        # chat requests, distinct questions, so the slots hold different
        # sequences; scripts/parallel_bench.py (Python: no Node here)
        rm -f $SHM/syn8.gguf $SHM/syn8e.gguf
        m=$(env "${fit_args[@]}" QUANTIZE=$B/ds4-quantize bench/h200_synth_model.sh "$OUT/server_model" 2> "$OUT/server_model.log") || {
            say "server: no model: $(tail -2 "$OUT/server_model.log" | tr '\n' ' ')"; continue; }
        for c in ${SRV_CFGS:-default}; do
            f=$(fname "$c")
            env $(cfg_env "$c") PARALLEL_BENCH_START_S=300 timeout "${SRV_TIMEOUT:-400}" python3 scripts/parallel_bench.py \
                --clients "${SRV_CLIENTS:-1,16}" --requests "${SRV_REQUESTS:-2}" --tokens "${SRV_TOKENS:-128}" \
                --rounds "${SRV_ROUNDS:-2}" --long-prompt "${SRV_LONG:-8000}" --csv "$OUT/server_$f.csv" \
                "$B/ds4-server" -m "$m" --backend "${SRV_BACKEND:-cuda}" \
                --ctx "${SRV_CTX:-16384}" --parallel "${SRV_PARALLEL:-16}" --warmup \
                > "$OUT/server_$f.log" 2> "$OUT/server_$f.err"
            rc=$?
            say "server $c: rc $rc$(timed_out $rc) $(grep -E '^long prompt|^ +[0-9]+ +best' "$OUT/server_$f.log" | tr -s ' ' | tr '\n' ';')"
            [ $rc = 0 ] || say "$(tail -3 "$OUT/server_$f.log" "$OUT/server_$f.err" | tr '\n' ' ' | cut -c1-400)"
        done
        # the long prompt again at other --prefill-chunk values (one slot)
        for k in ${SRV_CHUNKS-128 2048}; do
            PARALLEL_BENCH_START_S=300 timeout "${SRV_TIMEOUT:-400}" python3 scripts/parallel_bench.py \
                --clients "" --long-prompt "${SRV_LONG:-8000}" --csv "$OUT/server_chunk$k.csv" \
                "$B/ds4-server" -m "$m" --backend "${SRV_BACKEND:-cuda}" --ctx "${SRV_CTX:-16384}" --parallel 1 \
                --prefill-chunk "$k" --warmup > "$OUT/server_chunk$k.log" 2> "$OUT/server_chunk$k.err"
            rc=$?
            say "server --prefill-chunk $k: rc $rc$(timed_out $rc) $(grep -E '^long prompt' "$OUT/server_chunk$k.log")"
        done
        ;;
    streamtests)
        ln -sf "$PWD/$B/ds4-quantize" ./ds4-quantize
        DS4_BIN_DIR=$B tests/run_tests.sh $T/test_cuda_expert_cache $T/test_expert_slots \
            tests/test_cuda_expert_cache.sh > "$OUT/streamtests.log" 2>&1
        say "stream tests: $(tail -1 "$OUT/streamtests.log")"
        grep -E "^FAIL|^SKIP|failed|differ" "$OUT/streamtests.log" | head -20 | tee -a "$summary"
        ;;
    stream)
        rm -f $SHM/syn8.gguf $SHM/cpu.bin $SHM/cuda.bin
        ln -sf "$PWD/$B/ds4-quantize" ./ds4-quantize
        ln -sf "$PWD/$B/ds4-bench" ./ds4-bench
        bench/h200_stream.sh "$OUT/stream" > "$OUT/stream.log" 2>&1
        say "stream: rc $? $(grep 'written in' "$OUT/stream.log" || true)"
        say "$(cat "$OUT/stream/stream.csv" 2>/dev/null)"
        say "$(grep -h -E 'copy bandwidth|cuda expert cache:|warning|rror' "$OUT"/stream/*.log 2>/dev/null | head -12)"
        cp "$OUT/stream/stream.csv" "$OUT/stream.csv" 2>/dev/null
        ;;
    profile)
        # where a decode step's GPU time goes: per-op wall times (each op
        # synchronized: ~10 us of overhead per op) and, when ncu works here,
        # per-kernel GPU times of ~1 decode step with plain launches
        synth8
        DS4_CUDA_PROFILE=1 "$B/ds4-gpubench" --model $SHM/syn8.gguf --prefill 8 --decode 32 \
            > "$OUT/profile_ops.log" 2>&1
        say "$(grep -A40 -i 'profile' "$OUT/profile_ops.log" | head -45)"
        if command -v ncu > /dev/null; then
            DS4_CUDA_GRAPH=0 timeout 240 ncu --metrics gpu__time_duration.sum --csv --clock-control none \
                --launch-skip "${NCU_SKIP:-2400}" --launch-count "${NCU_COUNT:-400}" \
                "$B/ds4-gpubench" --model $SHM/syn8.gguf --prefill 8 --decode 16 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
            python3 scripts/ncu_summary.py "$OUT/ncu.csv" > "$OUT/ncu_summary.txt" 2>&1
            say "$(head -40 "$OUT/ncu_summary.txt")"
        else
            say "no ncu on this machine"
        fi
        ;;
    layerprof)
        # where a decode step's GPU time goes at full-size shapes: 8 layers
        # with all 256 experts (a token reads what one full-size layer reads),
        # the graph-replayed step timed, then every kernel of a few decode
        # steps timed alone by ncu with caches flushed before each (weights
        # come from HBM as they do at full size); the CSV comes back whole
        synth8e
        for c in ${LP_CFGS:-new}; do
            env $(cfg_env "$c") DS4_CUDA_GRAPH_VERBOSE=1 "$B/ds4-gpubench" --model $SHM/syn8e.gguf --prefill 512 \
                --decode 128 > "$OUT/lp_model_$(fname $c).log" 2>&1
            say "model 8L 256x $c: $(grep -E 'decode|host walk' "$OUT/lp_model_$(fname $c).log" | tr '\n' ' ')"
        done
        if command -v ncu > /dev/null; then
            for c in ${LP_NCU_CFGS:-new}; do
                f=lp_ncu_$(fname "$c")
                env $(cfg_env "$c") DS4_CUDA_GRAPH=0 timeout 300 ncu --metrics gpu__time_duration.sum --csv \
                    --clock-control none --cache-control all --launch-count "${LP_COUNT:-4000}" \
                    "$B/ds4-gpubench" --model $SHM/syn8e.gguf --prefill 8 --decode 4 > "$OUT/$f.csv" 2> "$OUT/$f.err"
                say "layerprof ncu $c: rc $? $(grep -c gpu__time_duration "$OUT/$f.csv") kernels"
                python3 scripts/ncu_summary.py "$OUT/$f.csv" --last-step cb_embed_kernel > "$OUT/${f}_summary.txt" 2>&1
                say "$(head -${LP_LINES:-45} "$OUT/${f}_summary.txt")"
            done
            command -v cuobjdump > /dev/null && cuobjdump -sass "$B/ds4-gpubench" 2>/dev/null | gzip > "$OUT/sass.txt.gz"
        else
            say "no ncu on this machine"
        fi
        ;;
    batchprof)
        # where a batched decode step's time goes: the 8-layer, 256-expert
        # model at a 2048-token frontier, one session and 16 (BP_BATCH)
        # sessions holding different sequences, timed plainly, then with
        # DS4_CUDA_PROFILE=1 (every op synchronized and timed: per-op wall
        # times, ~10 us of overhead each); the batched run's table minus the
        # one-session run's is the batched steps' share
        synth8e
        bp_args=(-m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 2048
                 --ctx-max 2048 --step-incr 2048 --gen-tokens "${BP_GEN:-32}")
        "$B/ds4-bench" "${bp_args[@]}" --batch-sessions "${BP_BATCH:-16}" --csv "$OUT/batchprof.csv" \
            > "$OUT/batchprof.log" 2>&1
        say "batchprof: rc $? $(tail -1 "$OUT/batchprof.csv" 2>/dev/null)"
        DS4_CUDA_PROFILE=1 "$B/ds4-bench" "${bp_args[@]}" > "$OUT/batchprof_p1.log" 2>&1
        DS4_CUDA_PROFILE=1 "$B/ds4-bench" "${bp_args[@]}" --batch-sessions "${BP_BATCH:-16}" \
            > "$OUT/batchprof_p16.log" 2>&1
        say "one session:"
        say "$(grep -A40 'cuda backend profile' "$OUT/batchprof_p1.log" | head -40)"
        say "with ${BP_BATCH:-16} batched sessions:"
        say "$(grep -A40 'cuda backend profile' "$OUT/batchprof_p16.log" | head -40)"
        ;;
    batchncu)
        # a batched decode step's GPU time, kernel by kernel: the 8-layer,
        # 256-expert model at a 2048-token frontier, 16 (BP_BATCH) sessions
        # holding different sequences, every kernel timed alone by ncu
        # (caches flushed) and the last whole batched step summed, against
        # the same step's wall time without ncu (batchprof's first line):
        # their gap is the host's share of the step
        # (BN_CALLS=PREFIX also lists each launch of those kernels)
        synth8e
        bn_args=(-m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 2048
                 --ctx-max 2048 --step-incr 2048)
        "$B/ds4-bench" "${bn_args[@]}" --gen-tokens 32 --batch-sessions "${BP_BATCH:-16}" --csv "$OUT/batchncu.csv" \
            > "$OUT/batchncu_plain.log" 2>&1
        say "batchncu plain: rc $? $(tail -1 "$OUT/batchncu.csv" 2>/dev/null)"
        if [ "${BN_NCU:-1}" = 0 ]; then
            say "batchncu: ncu skipped (BN_NCU=0)"
        elif command -v ncu > /dev/null; then
            DS4_CUDA_GRAPH=0 timeout "${BN_TIMEOUT:-300}" ncu --metrics gpu__time_duration.sum --csv \
                --clock-control none --cache-control all --launch-count "${BN_COUNT:-12000}" \
                "$B/ds4-bench" "${bn_args[@]}" --gen-tokens 3 --batch-sessions "${BP_BATCH:-16}" \
                > "$OUT/bn_ncu.csv" 2> "$OUT/bn_ncu.err"
            say "batchncu ncu: rc $? $(grep -c gpu__time_duration "$OUT/bn_ncu.csv") kernels"
            python3 scripts/ncu_summary.py "$OUT/bn_ncu.csv" --last-step cb_embed_kernel ${BN_CALLS:+--calls "$BN_CALLS"} > "$OUT/bn_ncu_summary.txt" 2>&1
            say "$(head -${BN_LINES:-50} "$OUT/bn_ncu_summary.txt")"
        else
            say "no ncu on this machine"
        fi
        ;;
    kncu)
        # one kernel under configurations (KN_CFGS): ncu times only the
        # launches whose name matches KN_KERNEL (a regex; caches flushed) in
        # batchncu's 16-session run (KN_BATCH=1: one session's decode) and
        # sums the last KN_LAST of them (the last step's 8 layers); KN_METRICS
        # (comma-separated ncu metric names, e.g. smsp__inst_executed.sum,
        # sm__throughput.avg.pct_of_peak_sustained_elapsed) are collected too
        # and summed / averaged per kernel over the same launches
        synth8e
        kn_b=()
        [ "${KN_BATCH:-16}" != 1 ] && kn_b=(--batch-sessions "${KN_BATCH:-16}")
        for c in ${KN_CFGS:-new}; do
            f=kncu_$(fname "$c")
            env $(cfg_env "$c") DS4_CUDA_GRAPH=0 timeout "${KN_TIMEOUT:-200}" ncu --metrics gpu__time_duration.sum${KN_METRICS:+,$KN_METRICS} \
                --csv --clock-control none --cache-control all --kernel-name "regex:${KN_KERNEL:-ds4_gb_kernel}" \
                "$B/ds4-bench" -m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt \
                --ctx-start 2048 --ctx-max 2048 --step-incr 2048 --gen-tokens 3 "${kn_b[@]}" \
                > "$OUT/$f.csv" 2> "$OUT/$f.err"
            say "kncu $c: rc $? $(python3 scripts/ncu_summary.py "$OUT/$f.csv" --tail "${KN_LAST:-8}" | sed -n 3,4p | tr '\n' ' ')"
            for m in $(printf '%s' "${KN_METRICS:-}" | tr , ' '); do
                say "  $m: $(python3 scripts/ncu_summary.py "$OUT/$f.csv" --tail "${KN_LAST:-8}" --metric "$m" | tail -n +2 | tr -s ' ' | tr '\n' ';')"
            done
        done
        ;;
    prefill2)
        # whether a process's first prefill pays one-time costs (first kernel
        # launches, cuBLAS's first calls, scratch growth): the 8-layer,
        # 256-expert model prefilled to 8192 in four 2048-token steps (a row
        # each), with lazy (default) and eager module loading, twice each
        synth8e
        p2_args=(-m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 2048
                 --ctx-max 8192 --step-incr 2048 --gen-tokens 8)
        for r in 1 2; do
            for ml in LAZY EAGER; do
                CUDA_MODULE_LOADING=$ml "$B/ds4-bench" "${p2_args[@]}" --csv "$OUT/prefill2_${ml}_$r.csv" \
                    > "$OUT/prefill2_${ml}_$r.log" 2>&1
                say "prefill2 $ml $r: rc $? prefill tok/s by row: $(tail -n +2 "$OUT/prefill2_${ml}_$r.csv" |
                    cut -d, -f3 | tr '\n' ' ')"
            done
        done
        ;;
    prefillops)
        # the same four 2048-token steps with every op's wall time on its own
        # line (DS4_CUDA_PROFILE=2), summed per row by scripts/prof_rows.py:
        # which ops a first prefill pays for
        synth8e
        DS4_CUDA_PROFILE=2 "$B/ds4-bench" -m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt \
            --ctx-start 2048 --ctx-max 8192 --step-incr 2048 --gen-tokens 8 --csv "$OUT/prefillops.csv" \
            > "$OUT/prefillops.log" 2>&1
        say "prefillops: rc $? prefill tok/s by row: $(tail -n +2 "$OUT/prefillops.csv" | cut -d, -f3 | tr '\n' ' ')"
        python3 scripts/prof_rows.py "$OUT/prefillops.log" > "$OUT/prefillops_rows.txt" 2>&1
        say "$(head -60 "$OUT/prefillops_rows.txt")"
        ;;
    prefilln)
        # after ds4-bench --warmup (a 2048-token step), two 1000-token steps
        # with each op's time (DS4_CUDA_PROFILE=2): does a new token count
        # (a prompt's last, partial step) pay a first-use cost again?
        synth8e
        DS4_CUDA_PROFILE=2 "$B/ds4-bench" -m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt \
            --warmup --ctx-start 1000 --ctx-max 2000 --step-incr 1000 --gen-tokens 8 --csv "$OUT/prefilln.csv" \
            > "$OUT/prefilln.log" 2>&1
        say "prefilln: rc $? prefill tok/s by row: $(tail -n +2 "$OUT/prefilln.csv" | cut -d, -f3 | tr '\n' ' ')"
        say "$(grep 'warm-up' "$OUT/prefilln.log")"
        python3 scripts/prof_rows.py "$OUT/prefilln.log" > "$OUT/prefilln_rows.txt" 2>&1
        say "$(head -30 "$OUT/prefilln_rows.txt")"
        ;;
    prefillprof)
        synth8e
        pp_args=(--model $SHM/syn8e.gguf --prefill "${PP_TOKENS:-2048}" --decode 1 --chunk "${PP_CHUNK:-512}")
        for c in ${PP_CFGS:-new}; do
            env $(cfg_env "$c") "$B/ds4-gpubench" "${pp_args[@]}" > "$OUT/prefillprof_$(fname $c).log" 2>&1
            say "prefillprof $c: rc $? $(grep -E '^prefill' "$OUT/prefillprof_$(fname $c).log" | tr '\n' ' ')"
        done
        DS4_CUDA_PROFILE=1 "$B/ds4-gpubench" "${pp_args[@]}" > "$OUT/prefillprof_ops.log" 2>&1
        say "$(grep -A45 'cuda backend profile' "$OUT/prefillprof_ops.log" | head -45)"
        if command -v ncu > /dev/null; then
            DS4_CUDA_GRAPH=0 timeout 300 ncu --metrics gpu__time_duration.sum --csv --clock-control none \
                --launch-skip "${PP_NCU_SKIP:-450}" --launch-count "${PP_NCU_COUNT:-700}" \
                "$B/ds4-gpubench" --model $SHM/syn8e.gguf --prefill "${PP_NCU_PREFILL:-512}" --decode 1 \
                --chunk "${PP_CHUNK:-512}" > "$OUT/pp_ncu.csv" 2> "$OUT/pp_ncu.err"
            python3 scripts/ncu_summary.py "$OUT/pp_ncu.csv" > "$OUT/pp_ncu_summary.txt" 2>&1
            say "$(head -${PP_LINES:-45} "$OUT/pp_ncu_summary.txt")"
        else
            say "no ncu on this machine"
        fi
        ;;
    ncudetail)
        case ${NCU_MODEL:-} in
        "") synth8 ;;
        $SHM/syn8e.gguf) synth8e ;;
        esac
        if command -v ncu > /dev/null; then
            DS4_CUDA_GRAPH=0 timeout 300 ncu --set full --import-source no --cache-control "${NCU_CACHE:-none}" \
                --clock-control none \
                -k "regex:${NCU_KERNELS:-ds4_mq_pipe|cb_rmsnorm|cb_hc_fused4|ds4_fmv|ds4_q8f|cb_rope|cb_attn_split|cb_hc_post}" \
                --launch-skip "${NCU_DSKIP:-900}" --launch-count "${NCU_DCOUNT:-40}" -o "$OUT/detail" \
                "$B/ds4-gpubench" --model "${NCU_MODEL:-$SHM/syn8.gguf}" ${NCU_ARGS:---prefill 8 --decode 16} \
                > "$OUT/ncu_detail.log" 2>&1
            ncu --import "$OUT/detail.ncu-rep" --page details > "$OUT/ncu_detail.txt" 2>&1
            # NCU_SOURCE=1: the SASS of each kernel with its stall samples per instruction
            [ "${NCU_SOURCE:-0}" = 1 ] && ncu --import "$OUT/detail.ncu-rep" --page source --print-source sass --csv \
                > "$OUT/ncu_source.csv" 2> "$OUT/ncu_source.err"
            rm -f "$OUT/detail.ncu-rep"
            say "$(grep -E '^  [a-z_]|Duration|Registers Per|Achieved Occupancy|Memory Throughput|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|L1/TEX Hit|Shared Memory' \
                "$OUT/ncu_detail.txt" | head -${NCU_LINES:-80})"
        else
            say "no ncu on this machine"
        fi
        ;;
    batchdetail)
        # ncu --set full on a 16-session batched step's kernels named by
        # $BD_KERNELS ($BD_COUNT launches after $BD_SKIP matching ones; the
        # 8-layer, 256-expert model at a 2048-token frontier): stall
        # reasons, shared-memory and L2 traffic of the batch's kernels
        synth8e
        if command -v ncu > /dev/null; then
            timeout "${BD_TIMEOUT:-300}" ncu --set full --import-source no --cache-control all --clock-control none \
                -k "regex:${BD_KERNELS:-ds4_gb_kernel|ds4_gd_kernel|ds4_q8m_kernel}" \
                --launch-skip "${BD_SKIP:-6}" --launch-count "${BD_COUNT:-6}" -o "$OUT/bdetail" \
                "$B/ds4-bench" -m $SHM/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt \
                --ctx-start 2048 --ctx-max 2048 --step-incr 2048 --gen-tokens 2 --batch-sessions "${BP_BATCH:-16}" \
                > "$OUT/ncu_bdetail.log" 2>&1
            ncu --import "$OUT/bdetail.ncu-rep" --page details > "$OUT/ncu_bdetail.txt" 2>&1
            # BD_SOURCE=1: each kernel's SASS with its sampled stall reasons
            # by instruction (the source page; gzipped CSV)
            if [ "${BD_SOURCE:-0}" = 1 ]; then
                ncu --import "$OUT/bdetail.ncu-rep" --page source --print-source sass --csv 2> "$OUT/ncu_bdetail_sass.err" |
                    gzip > "$OUT/ncu_bdetail_sass.csv.gz"
            fi
            [ "${BD_KEEP:-0}" = 1 ] || rm -f "$OUT/bdetail.ncu-rep"
            say "$(grep -E '^  [a-z_]|Duration|Registers Per|Achieved Occupancy|Memory Throughput|DRAM Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Shared Memory|Bank' \
                "$OUT/ncu_bdetail.txt" | head -${BD_LINES:-120})"
        else
            say "no ncu on this machine"
        fi
        ;;
    *) say "unknown step $s" ;;
    esac
    say "  [$s done at $(( $(date +%s) - t_start )) s]"
done
# OUT_ONE=1: the CSV files go into logs.tgz too (a device call brings back
# eight files at most: a call of several steps or runs then still gets all)
keep='*.csv'
[ "${OUT_ONE:-0}" = 1 ] && keep=summary.txt
(cd "$OUT" && tar czf /tmp/h200-logs.tgz --exclude summary.txt --exclude "$keep" . &&
    find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name "$keep" -exec rm -rf {} + &&
    mv /tmp/h200-logs.tgz logs.tgz)
echo "==== summary"
cat "$summary"
