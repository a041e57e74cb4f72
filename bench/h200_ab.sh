#!/usr/bin/env bash
# h200_ab.sh - two builds side by side on one GPU machine: the package of
# the build before (.devwork/base.tar.xz, made by BASE=1 bench/h200_pack.sh
# at that commit: programs only, so both packages fit the device call) and of this one (.devwork/pkg.tar.xz), alternated AB_REPEAT times
# (default 2) so that the machine's drift falls on both alike.
#
#   OUT=dir [BASE_ENV="X=0"] [NEW_CFGS="name:ENV=..."] bench/h200_ab.sh decode|prefill|logits|batch ...
#
#   logits   the 8-layer synthetic's logits (256 prefilled, 256 decoded
#            positions) from both builds: bit for bit or not
#   decode   the 8-layer, 256-expert synthetic's replayed decode step
#            (ds4-gpubench --prefill 512 --decode 128)
#   prefill  the same model prefilling 8192 tokens in 2048-token steps
#            (ds4-gpubench --prefill 8192 --chunk 2048)
#   batch    the same model at a 2048-token frontier, $AB_BATCH (16) sessions
#            holding different sequences decoded together for 32 steps
#            (ds4-bench --batch-sessions): the aggregate tokens/s
# BASE_ENV: environment for the base build (e.g. a switch that makes it
# the code before); NEW_CFGS: space-separated label:VAR=value[,VAR=value]
# variants of the new build besides its defaults.
set -u
OUT=${OUT:-ab-out}
mkdir -p .devwork/b "$OUT"
# the packages, unless already unpacked there (.devwork/b/pkg, .devwork/pkg): with the tracked tree
# grown past ~55 MiB the two tarballs no longer fit a device call beside it, one tarball of both does
[ -f .devwork/base.tar.xz ] && { tar xJf .devwork/base.tar.xz -C .devwork/b || exit 1; }
[ -f .devwork/pkg.tar.xz ] && { tar xJf .devwork/pkg.tar.xz -C .devwork || exit 1; }
[ -x .devwork/b/pkg/bin/ds4 ] && [ -x .devwork/pkg/bin/ds4 ] || { echo "h200_ab.sh: no base or new package" >&2; exit 1; }
Q=.devwork/pkg/bin/ds4-quantize
export LD_LIBRARY_PATH=$PWD/.devwork/pkg/lib
[ -s /dev/shm/syn8.gguf ] || $Q --synthetic flash --layers 8 --n-experts 16 --out /dev/shm/syn8.gguf \
    --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > /dev/null 2>&1
[ -s /dev/shm/syn8e.gguf ] || $Q --synthetic flash --layers 8 --out /dev/shm/syn8e.gguf \
    --tokenizer tests/data/tokenizer/dsv4-vocab.gguf --quiet > /dev/null 2>&1
run() { # label pkgdir env(comma-separated or empty) program args...
    local l=$1 p=$2 e=$3; shift 3
    local prog=$1; shift
    env ${e//,/ } LD_LIBRARY_PATH=$PWD/.devwork/$p/lib ".devwork/$p/bin/$prog" "$@"
}
for step in "$@"; do
    case $step in
    logits)
        for p in b/pkg pkg; do
            e=${BASE_ENV:-}; [ $p = pkg ] && e=
            run "$p" "$p" "$e" ds4 -m /dev/shm/syn8.gguf --cuda --token-ids .devwork/pkg/ids512.txt --decode-from 256 \
                --dump-logits "/dev/shm/ab_${p//\//_}.bin" > "$OUT/logits_${p//\//_}.log" 2>&1
        done
        if cmp -s /dev/shm/ab_b_pkg.bin /dev/shm/ab_pkg.bin; then
            echo "logits: base and new bit for bit ($(stat -c %s /dev/shm/ab_pkg.bin) bytes)"
        else echo "logits: base and new DIFFER"; fi
        ;;
    decode|prefill)
        if [ "$step" = decode ]; then args=(--model /dev/shm/syn8e.gguf --prefill 512 --decode 128); pat='^decode'
        else args=(--model /dev/shm/syn8e.gguf --prefill 8192 --decode 1 --chunk 2048); pat='^prefill'; fi
        for i in $(seq "${AB_REPEAT:-2}"); do
            echo "$step base: $(run base b/pkg "${BASE_ENV:-}" ds4-gpubench "${args[@]}" 2>&1 | grep -E "$pat" | head -1)"
            echo "$step new: $(run new pkg "" ds4-gpubench "${args[@]}" 2>&1 | grep -E "$pat" | head -1)"
            for v in ${NEW_CFGS:-}; do
                echo "$step new ${v%%:*}: $(run "${v%%:*}" pkg "${v#*:}" ds4-gpubench "${args[@]}" 2>&1 | grep -E "$pat" | head -1)"
            done
        done
        ;;
    batch)
        args=(-m /dev/shm/syn8e.gguf --prompt-file tests/data/bench/promessi_sposi.txt --ctx-start 2048 --ctx-max 2048
              --step-incr 2048 --gen-tokens 32 --batch-sessions "${AB_BATCH:-16}" --csv /dev/shm/ab_batch.csv)
        agg() { tail -1 /dev/shm/ab_batch.csv | awk -F, '{print $NF " tokens/s aggregate (one session: " $5 ")"}'; }
        for i in $(seq "${AB_REPEAT:-2}"); do
            run base b/pkg "${BASE_ENV:-}" ds4-bench "${args[@]}" > /dev/null 2>&1; echo "batch base: $(agg)"
            run new pkg "" ds4-bench "${args[@]}" > /dev/null 2>&1; echo "batch new: $(agg)"
            for v in ${NEW_CFGS:-}; do
                run "${v%%:*}" pkg "${v#*:}" ds4-bench "${args[@]}" > /dev/null 2>&1; echo "batch new ${v%%:*}: $(agg)"
            done
        done
        ;;
    *) echo "h200_ab.sh: unknown step $step" >&2; exit 2 ;;
    esac
done
