#!/usr/bin/env bash
# ds4-server --prefill-chunk N: the prompt is prefilled N tokens a step. Two
# servers on the demo model (models/ds4-demo.gguf, CPU backend), one with
# --prefill-chunk 100 and one with the CPU's default (128): each startup
# report names its chunk, a 2750-token prompt's progress lines (logged at
# each quarter of a long prefill) stand at multiples of that chunk, and the
# greedy answers after the prompt are the same (the CPU's logits do not
# depend on how a prompt is cut into steps). A chunk over --ctx is cut to it.
set -u
cd "$(dirname "$0")/.."
. tests/server_lib.sh
srv_need curl

start() { srv_start "$1" -- --ctx 4096 "${@:2}"; } # start NAME FLAGS...: sets port_NAME
start c100 --prefill-chunk 100
start cdef
[ -n "$port_c100" ] && [ -n "$port_cdef" ] || { bad start "$(cat "$tmp"/*.err)"; echo "RESULT $pass $fail 0"; exit 1; }

# ~2750 tokens of plain text, then a question
text=$(for i in $(seq 1 250); do printf 'The river runs past the old mill and the bridge. '; done)
body="{\"model\":\"deepseek-chat\",\"temperature\":0,\"max_tokens\":12,\"messages\":[{\"role\":\"user\",\"content\":\"$text What runs past the mill?\"}]}"
for n in c100 cdef; do
    eval port=\$port_$n
    curl -s -o "$tmp/$n.json" "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' -d "$body"
done
for pair in c100:100 cdef:128; do
    n=${pair%%:*}; want=${pair##*:}
    grep -q "prefill chunk $want)" "$tmp/$n.err" && ok "${n}_startup_names_chunk_$want" \
        || bad "${n}_startup_names_chunk_$want" "$(grep 'startup: backend' "$tmp/$n.err")"
    # "prefill: slot 0: 700/2524 tokens (27%), ..." lines
    prog=$(sed -n 's#.*prefill: slot [0-9]*: \([0-9]*\)/\([0-9]*\) tokens.*#\1 \2#p' "$tmp/$n.err")
    if [ -n "$prog" ] && printf '%s\n' "$prog" | awk -v c="$want" '$1 % c != 0 || $2 < 2048 {bad = 1} END {exit bad}'; then
        ok "${n}_progress_at_multiples_of_$want ($(printf '%s' "$prog" | cut -d' ' -f1 | tr '\n' ' '))"
    else
        bad "${n}_progress_at_multiples_of_$want" "progress: [$prog]"
    fi
done
a=$(sed -n 's/.*"content":"\([^"]*\)".*/\1/p' "$tmp/c100.json"); b=$(sed -n 's/.*"content":"\([^"]*\)".*/\1/p' "$tmp/cdef.json")
[ -n "$a" ] && [ "$a" = "$b" ] && ok "same_answer ($a)" || bad same_answer "chunk 100 [$a], default [$b]"

# a chunk larger than the context is the context
start cbig --prefill-chunk 16384
[ -n "$port_cbig" ] && grep -q "prefill chunk 4096)" "$tmp/cbig.err" && ok "chunk_cut_to_ctx" \
    || bad chunk_cut_to_ctx "$(grep 'startup: backend' "$tmp/cbig.err")"
srv_result
