#!/usr/bin/env bash
# h200_run.sh - one GPU session's checks and measurements in one command,
# with binaries built elsewhere (bench/h200_pack.sh makes the package: the
# programs, the GPU-side test binaries and the few shared libraries they
# link beyond the CUDA toolkit), run from the repository root.
#
#   PKG=.devwork/pkg OUT=outdir bench/h200_run.sh [STEP ...]
#
# Steps (default: tests kernels model exact):
#   tests     the GPU test binaries; again with DS4_CUDA_SMALL_V2=1 (the
#             rewritten small kernels) and with DS4_CUDA_MMVQ=0 (the f32
#             matvec), so every kernel path is checked
#   kernels   ds4-gpubench kernel table, int8 matvec on and off
#   model     8-layer Flash-shaped synthetic (16 experts): ds4-gpubench
#             --model for the old kernels (MMVQ=0, SMALL_V2=0) and the new
#   exact     CPU vs CUDA logits on the same synthetic, 512 positions
#             (256 prefilled, 256 decoded): top-1 agreement, max |dlogit|
#   full      the full-size synthetic Flash q2 (bench/h200_fullsize.sh):
#             ds4-bench over CTX_START..CTX_MAX, old and new kernels
# Logs go to $OUT/*.log; a summary table is printed last.
set -u
PKG=${PKG:-.devwork/pkg}
OUT=${OUT:-h200-out}
mkdir -p "$OUT" build/tests
export LD_LIBRARY_PATH="$PWD/$PKG/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$PKG/bin
T=$PKG/tests
steps=${*:-tests kernels model exact}
t_start=$(date +%s)
summary=$OUT/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
say "gpu: $(tail -1 "$OUT/gpu.txt")"

synth8() {
    [ -s /dev/shm/syn8.gguf ] && return
    "$B/ds4-quantize" --synthetic flash --layers 8 --n-experts 16 --out /dev/shm/syn8.gguf \
        --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > "$OUT/synth8.log" 2>&1
}

for s in $steps; do
    case $s in
    tests)
        all=""
        for t in test_cuda_decode test_cuda_kernels test_cuda_ops test_cuda_session test_ops \
                 test_model_golden test_decode_batch test_weight_share test_bench_model; do
            [ -x "$T/$t" ] && all="$all $T/$t"
        done
        DS4_BIN_DIR=$B tests/run_tests.sh $all > "$OUT/tests.log" 2>&1
        say "tests (default): $(tail -1 "$OUT/tests.log")"
        gpu="$T/test_cuda_kernels $T/test_cuda_ops $T/test_cuda_session $T/test_model_golden $T/test_decode_batch"
        DS4_CUDA_SMALL_V2=1 tests/run_tests.sh $gpu > "$OUT/tests_small_v2.log" 2>&1
        say "tests (DS4_CUDA_SMALL_V2=1): $(tail -1 "$OUT/tests_small_v2.log")"
        DS4_CUDA_MMVQ=0 tests/run_tests.sh $gpu > "$OUT/tests_mmvq0.log" 2>&1
        say "tests (DS4_CUDA_MMVQ=0): $(tail -1 "$OUT/tests_mmvq0.log")"
        ;;
    kernels)
        "$B/ds4-gpubench" > "$OUT/kernels.log" 2>&1
        DS4_CUDA_MMVQ=0 "$B/ds4-gpubench" > "$OUT/kernels_mmvq0.log" 2>&1
        say "kernels: see kernels.log / kernels_mmvq0.log"
        ;;
    model)
        synth8
        for cfg in "0 0" "1 0" "1 1"; do
            set -- $cfg
            DS4_CUDA_MMVQ=$1 DS4_CUDA_SMALL_V2=$2 DS4_CUDA_GRAPH_VERBOSE=1 "$B/ds4-gpubench" \
                --model /dev/shm/syn8.gguf --prefill 512 --decode 128 > "$OUT/model_mmvq$1_v2$2.log" 2>&1
            say "model 8L MMVQ=$1 SMALL_V2=$2: $(grep -i 'decode' "$OUT/model_mmvq$1_v2$2.log" | tail -1)"
        done
        ;;
    exact)
        synth8
        ids=$PKG/ids512.txt
        "$B/ds4" -m /dev/shm/syn8.gguf --cpu -t "$(nproc)" --token-ids "$ids" --decode-from 256 \
            --dump-logits /dev/shm/cpu.bin > "$OUT/exact_cpu.log" 2>&1
        for cfg in "1 0" "1 1" "0 0"; do
            set -- $cfg
            DS4_CUDA_MMVQ=$1 DS4_CUDA_SMALL_V2=$2 "$B/ds4" -m /dev/shm/syn8.gguf --cuda --token-ids "$ids" \
                --decode-from 256 --dump-logits /dev/shm/cuda.bin > "$OUT/exact_cuda.log" 2>&1
            say "exact CPU vs CUDA (MMVQ=$1 SMALL_V2=$2): $(python3 scripts/compare_logits.py /dev/shm/cpu.bin \
                /dev/shm/cuda.bin 512 --from 256 2>&1 | tr '\n' ' ')"
        done
        ;;
    full)
        rm -f /dev/shm/syn8.gguf /dev/shm/cpu.bin /dev/shm/cuda.bin
        ln -sf "$PWD/$B/ds4-quantize" ./ds4-quantize
        ln -sf "$PWD/$B/ds4-bench" ./ds4-bench
        for cfg in ${FULL_CFGS:-"1 1" "0 0"}; do
            set -- $cfg
            DS4_CUDA_MMVQ=$1 DS4_CUDA_SMALL_V2=$2 CTX_START=${CTX_START:-2048} CTX_MAX=${CTX_MAX:-2048} \
                STEP=${STEP:-2048} GEN=${GEN:-64} timeout "${FULL_TIMEOUT:-300}" bench/h200_fullsize.sh \
                "$OUT/full_mmvq$1_v2$2" > "$OUT/full_mmvq$1_v2$2.log" 2>&1
            say "full MMVQ=$1 SMALL_V2=$2: rc $? $(tail -3 "$OUT/full_mmvq$1_v2$2/bench.log" 2>/dev/null | tr '\n' ' ')"
        done
        ;;
    *) say "unknown step $s" ;;
    esac
    say "  [$s done at $(( $(date +%s) - t_start )) s]"
done
echo "==== summary"
cat "$summary"
