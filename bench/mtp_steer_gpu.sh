#!/usr/bin/env bash
# mtp_steer_gpu.sh - speculative decoding (--mtp) and directional steering on
# CUDA, compared with the CPU, in one GPU run (about 2 minutes), from the
# repository root, with binaries built here with CUDA and packed by
# bench/mtp_steer_pack.sh (.devwork/mtp18pkg: ds4, ds4-bench,
# test_cuda_mtp_steer and the shared libraries they need):
#
#   PKG=.devwork/mtp18pkg OUT=$OUT bash bench/mtp_steer_gpu.sh
#
# Writes $OUT/summary.txt (also stdout) and $OUT/*.log, $OUT/*.csv:
#   test      tests/test_cuda_mtp_steer.c: greedy tokens with 1..3 drafts ==
#             CUDA plain greedy; undo record vs full snapshot byte-equal on
#             CUDA; a trimmed step goes on as plain; steered logits CUDA vs
#             CPU (gap vs the unsteered gap), scale 0 bit-identical
#   cli       ds4 --cuda on 4 prompts x (plain, --mtp-draft 1, 2, 3): the
#             answers must be byte-identical; the same answers with --cpu;
#             tokens/s and acceptance from ds4's stats lines
#   bench     ds4-bench --cuda --mtp on the demo model: gen_tps (plain),
#             mtp_gen_tps (undo-record rollback), mtp_full_gen_tps (full
#             snapshots), same run; and the same on --cpu for the ratio
set -u
PKG=${PKG:-.devwork/mtp18pkg}
OUT=${OUT:-mtp18-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$PKG/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=$PKG/bin
M=models/ds4-demo.gguf
MTP=models/ds4-demo-mtp.gguf
summary=$OUT/summary.txt
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
t0=$(date +%s)
say "mtp_steer_gpu: commit $(cat "$PKG/commit.txt" 2>/dev/null) on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

# 1. the test binary (GPU vs CPU sessions)
timeout 120 "$PKG/tests/test_cuda_mtp_steer" > "$OUT/test.log" 2>&1
say "test_cuda_mtp_steer: rc $? ($(tail -1 "$OUT/test.log"))"
grep -E "^(PASS|FAIL|SKIP)|agrees|drafts:|byte-equal|steering|required|:[0-9]+: " "$OUT/test.log" | tee -a "$summary"

# 2. the ds4 CLI: --mtp output identical to plain on CUDA; CUDA vs CPU text
prompts=("What is the capital of Japan?" "What is the opposite of hot?" "Count from 1 to 5."
         "What's the weather in Oslo?")
same=0; total=0; cpu_same=0
for i in 0 1 2 3; do
    p=${prompts[$i]}
    timeout 30 "$B/ds4" -m $M -p "$p" --think --temp 0 -n 120 --cuda > "$OUT/cli_p${i}_plain.txt" 2> "$OUT/cli_p${i}_plain.log"
    timeout 30 "$B/ds4" -m $M -p "$p" --think --temp 0 -n 120 --cpu -t 8 > "$OUT/cli_p${i}_cpu.txt" 2> "$OUT/cli_p${i}_cpu.log"
    cmp -s "$OUT/cli_p${i}_plain.txt" "$OUT/cli_p${i}_cpu.txt" && cpu_same=$((cpu_same + 1))
    say "p$i plain cuda: $(grep -o 'generation .*' "$OUT/cli_p${i}_plain.log" | head -1)"
    for nd in 1 2 3; do
        timeout 30 "$B/ds4" -m $M -p "$p" --think --temp 0 -n 120 --cuda --mtp $MTP --mtp-draft $nd \
            > "$OUT/cli_p${i}_d$nd.txt" 2> "$OUT/cli_p${i}_d$nd.log"
        total=$((total + 1))
        if [ -s "$OUT/cli_p${i}_plain.txt" ] && cmp -s "$OUT/cli_p${i}_plain.txt" "$OUT/cli_p${i}_d$nd.txt"; then
            same=$((same + 1)); r=same
        else
            r=DIFFERENT
        fi
        say "p$i cuda --mtp-draft $nd: $r; $(grep -o 'generation .*' "$OUT/cli_p${i}_d$nd.log" | head -1); $(grep -o 'mtp: .*' "$OUT/cli_p${i}_d$nd.log" | head -1)"
    done
done
say "cli: --mtp answers identical to plain on CUDA: $same of $total; CUDA plain == CPU plain text: $cpu_same of 4"

# 3. ds4-bench: speculation vs plain, undo record vs full snapshot, same run
for be in cuda cpu; do
    timeout 60 "$B/ds4-bench" -m $M --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 256 --ctx-max 1024 \
        --step-mul 2 --gen-tokens 64 --$be -t 8 --mtp $MTP --mtp-draft 2 --csv "$OUT/bench_$be.csv" > "$OUT/bench_$be.log" 2>&1
    say "ds4-bench --$be --mtp-draft 2: rc $?"
    cat "$OUT/bench_$be.csv" 2>/dev/null | tee -a "$summary"
    awk -F, 'NR > 1 && $12 > 0 { printf "  ctx %s: mtp/plain %.2f, undo/full rollback %.2f, accept %.2f\n", $1, $10 / $5, $10 / $12, $11 }' \
        "$OUT/bench_$be.csv" 2>/dev/null | tee -a "$summary"
done
say "mtp_steer_gpu: done in $(( $(date +%s) - t0 )) s"
