#!/usr/bin/env bash
# test_h200_run_fit.sh - bench/h200_run.sh on a card too small for the
# full-size synthetic (81 GiB): on an H100's 80 GB the server and full
# steps make the file with 30 of its 43 layers and say so; on an H200's
# 141 GB the whole file; SYNTH_ARGS, when given, wins. The file's name
# carries the shape, so a file of another shape left by an earlier call is
# not reused (one was, on the H100, 2026-12-05). nvidia-smi and
# ds4-quantize are stand-ins that report a card's memory and record the
# arguments. No GPU needed. Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
. tests/h200_run_lib.sh
mkdir -p "$tmp/bin" "$tmp/pkg/bin" "$tmp/shm"
cat > "$tmp/bin/nvidia-smi" <<'EOF'
#!/bin/sh
case "$*" in
*noheader*) echo "$FAKE_MIB" ;;
*) echo "name, memory.total [MiB], clocks.max.sm [MHz], driver_version"
   echo "Fake GPU, $FAKE_MIB MiB, 1980 MHz, 0" ;;
esac
EOF
cat > "$tmp/pkg/bin/ds4-quantize" <<'EOF'
#!/bin/sh
echo "$*" > "$QUANT_LOG"
exit 1
EOF
chmod +x "$tmp/bin/nvidia-smi" "$tmp/pkg/bin/ds4-quantize"

# run MIB [SYNTH_ARGS]: the server step on a card of MIB MiB; the summary
# and the stand-in quantizer's arguments in $tmp/sum, $tmp/args
run() {
    rm -rf "$tmp/o" "$tmp/args"
    local given=()
    [ $# -gt 1 ] && given=(SYNTH_ARGS="$2")
    env PATH="$tmp/bin:$PATH" FAKE_MIB="$1" QUANT_LOG="$tmp/args" OUT="$tmp/o" SHM="$tmp/shm" PKG="$tmp/pkg" \
        BIG_TMP="$tmp/shm" NEED_GIB=0 "${given[@]}" bash bench/h200_run.sh server > "$tmp/log" 2>&1
    cat "$tmp/o/summary.txt" > "$tmp/sum" 2>/dev/null || : > "$tmp/sum"
    cat "$tmp/args" 2>/dev/null || true
}

args=$(run 81559)
case "$args" in
*"--layers 30 "*"--out $tmp/shm/ds4-flash-q2-synthetic-layers_30.gguf"*) ok "80 GB card: 30 layers, the shape in the name" ;;
*) bad "80 GB card" "args '$args', $(tail -3 "$tmp/log")" ;;
esac
grep -q "^model: full and server take the full-size synthetic cut to 30 of its 43 layers" "$tmp/sum" &&
    ok "80 GB card: the summary says so" || bad "80 GB card summary" "$(cat "$tmp/sum")"

args=$(run 143771)
case "$args" in
*"--layers"*) bad "141 GB card" "args '$args'" ;;
*"--out $tmp/shm/ds4-flash-q2-synthetic.gguf"*) ok "141 GB card: the whole file" ;;
*) bad "141 GB card" "args '$args', $(tail -3 "$tmp/log")" ;;
esac
grep -q "^model:" "$tmp/sum" && bad "141 GB card summary" "$(cat "$tmp/sum")" || ok "141 GB card: no cut named"

args=$(run 81559 "--layers 8 --n-experts 16")
case "$args" in
*"--layers 8 --n-experts 16 "*"synthetic-layers_8_n_experts_16.gguf"*) ok "SYNTH_ARGS given: it wins" ;;
*) bad "SYNTH_ARGS given" "args '$args'" ;;
esac
h2_result
