#!/usr/bin/env bash
# --tensor-parallel in the front ends (docs/TENSOR-PARALLEL.md), CPU backend:
# ds4 gives the demo model's own answer (the training data's, models/README.md)
# with 2 and 4 in-process ranks; ds4-bench walks a synthetic model with
# --tensor-parallel 2 and batched sessions; what is not supported is refused
# with its reason (bad counts, a GPU list without tensor parallel, MTP,
# expert streaming, an MPI run).
set -u
cd "$(dirname "$0")/.."
BIN=${DS4_BIN_DIR:-.}
. tests/counters_lib.sh
export DS4_BACKEND=cpu
demo=models/ds4-demo.gguf

if [ -f "$demo" ]; then
    for n in 2 4; do
        out=$("$BIN/ds4" -m "$demo" -p "What is the capital of France?" --nothink --temp 0 -n 40 --threads 2 \
            --tensor-parallel $n 2>"$tmp/err"); rc=$?
        [ $rc -eq 0 ] && [ "$out" = "The capital of France is Paris." ] && ok "ds4_tp$n" \
            || bad "ds4_tp$n: rc $rc out '$out' err '$(tail -2 "$tmp/err")'"
    done
    "$BIN/ds4" -m "$demo" --mtp models/ds4-demo-mtp.gguf --tensor-parallel 2 -p hi -n 3 >/dev/null 2>"$tmp/err"; rc=$?
    [ $rc -ne 0 ] && grep -q "tensor parallel" "$tmp/err" && ok refuse_mtp || bad "refuse_mtp: rc $rc $(cat "$tmp/err")"
else
    echo "SKIP ds4: $demo missing"; skip=$((skip + 1))
fi

expect_err() { # name pattern args...: ds4 fails, stderr has pattern
    local name=$1 pat=$2; shift 2
    "$BIN/ds4" "$@" >/dev/null 2>"$tmp/err"; local rc=$?
    [ $rc -ne 0 ] && grep -q -- "$pat" "$tmp/err" && ok "$name" || bad "$name: rc $rc $(cat "$tmp/err")"
}
expect_err refuse_count_zero "expected a rank count" -m "$demo" --tensor-parallel 0 -p hi
expect_err refuse_count_word "expected a rank count" -m "$demo" --tensor-parallel two -p hi
expect_err refuse_count_65 "expected a rank count" -m "$demo" --tensor-parallel 65 -p hi
expect_err refuse_devices_alone "needs --tensor-parallel" -m "$demo" --gpu-devices 0,1 -p hi
expect_err refuse_streaming "not with --ssd-streaming" -m "$demo" --tensor-parallel 2 --ssd-streaming -p hi
expect_err refuse_device_list "GPU device list" -m "$demo" --tensor-parallel 2 --gpu-devices 0,x -p hi

# ds4-bench: the walk and the batched sessions over 2 ranks
"$BIN/ds4-quantize" --synthetic tests/data/bench/synthetic-tiny.json --out "$tmp/tiny.gguf" \
    --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet 2>"$tmp/err"
if [ -s "$tmp/tiny.gguf" ]; then
    # a short prompt file and small chunks: session set-up is most of the time
    head -c 6000 tests/data/bench/promessi_sposi.txt >"$tmp/prompt.txt"
    "$BIN/ds4-bench" -m "$tmp/tiny.gguf" --prompt-file "$tmp/prompt.txt" --ctx-start 40 --ctx-max 80 --step-mul 2 \
        --gen-tokens 3 --threads 2 --cpu --batch-sessions 3 --tensor-parallel 2 --prefill-chunk 64 \
        >"$tmp/b.csv" 2>"$tmp/err"; rc=$?
    [ $rc -eq 0 ] && awk -F, 'NR > 1 { n++; if (NF != 10 || $9 != 3 || !($5 + 0 > 0) || !($10 + 0 > 0)) bad = 1 }
        END { exit bad || n != 2 }' "$tmp/b.csv" && ok bench_tp2 || bad "bench_tp2: rc $rc $(cat "$tmp/b.csv" "$tmp/err")"
else
    bad "synthetic model: $(cat "$tmp/err")"
fi

# tensor parallel inside an mpirun job is refused on the front end
if command -v mpirun >/dev/null 2>&1 && [ -f "$demo" ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
    export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_plm_rsh_agent=false
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
    timeout 60 mpirun --oversubscribe --bind-to none -np 2 "$BIN/ds4" -m "$demo" --tensor-parallel 2 -p hi -n 2 \
        >/dev/null 2>"$tmp/err"; rc=$?
    [ $rc -ne 0 ] && grep -q "tensor parallel inside an MPI run" "$tmp/err" && ok refuse_mpi \
        || bad "refuse_mpi: rc $rc $(tail -3 "$tmp/err")"
else
    echo "SKIP refuse_mpi: mpirun not found (Debian: openmpi-bin)"; skip=$((skip + 1))
fi
echo "RESULT $pass $fail $skip"
[ "$fail" -eq 0 ]
