#!/usr/bin/env bash
# test_cli_dump_tokens.sh - `ds4 --dump-tokens` on the vocab-only GGUF:
# ids and escaped pieces for fixed strings (ids from the shared tokenizer
# cases), -p and --prompt-file agree, bad usage fails with a message.
set -u
BIN=${DS4_BIN_DIR:-.}/ds4
VOCAB=tests/data/tokenizer/dsv4-vocab.gguf
. tests/counters_lib.sh

# 1. "Hello, world!" -> 19923 14 2058 3 (dsv4-tokenizer-tests.jsonl "hello")
out=$("$BIN" -m "$VOCAB" --dump-tokens -p "Hello, world!")
want=$'19923\tHello\n14\t,\n2058\t world\n3\t!'
[ "$out" = "$want" ] && ok dump_tokens_hello || bad "dump_tokens_hello: got [$out]"

# 2. special tokens and CJK from a file, exactly as written (no BOS, no template)
printf '<｜User｜>你好<｜Assistant｜><think>推理</think>答案<｜end▁of▁sentence｜>' > "$tmp/p.txt"
ids=$("$BIN" -m "$VOCAB" --dump-tokens --prompt-file "$tmp/p.txt" | cut -f1 | tr '\n' ' ')
[ "$ids" = "128803 30594 128804 128821 36101 128822 7624 1 " ] && ok dump_tokens_specials || bad "dump_tokens_specials: got [$ids]"

# 3. escaping: newline, tab, backslash, non-ASCII bytes
printf 'a\\b\n\t\xc3\xa9' > "$tmp/e.txt"
out=$("$BIN" -m "$VOCAB" --dump-tokens --prompt-file "$tmp/e.txt" | cut -f2 | tr '\n' '|')
case "$out" in
    *'\\'*'\n'*'\t'*'\xc3'*) ok dump_tokens_escaping ;;
    *) bad "dump_tokens_escaping: got [$out]" ;;
esac

# 4. -p and --prompt-file give the same lines
printf 'Il 7 aprile 1628, «Renzo» disse: “ciao”.' > "$tmp/q.txt"
a=$("$BIN" -m "$VOCAB" --dump-tokens --prompt-file "$tmp/q.txt")
b=$("$BIN" -m "$VOCAB" --dump-tokens -p "$(cat "$tmp/q.txt")")
[ -n "$a" ] && [ "$a" = "$b" ] && ok dump_tokens_file_equals_arg || bad dump_tokens_file_equals_arg

# 5. promessi_sposi.txt: 417059 lines (one per token)
n=$("$BIN" -m "$VOCAB" --dump-tokens --prompt-file tests/data/bench/promessi_sposi.txt | wc -l)
[ "$n" -eq 417059 ] && ok dump_tokens_promessi_count || bad "dump_tokens_promessi_count: $n"

# 6. errors: missing model, missing prompt, unknown option -> non-zero with a message
if "$BIN" -m "$tmp/none.gguf" --dump-tokens -p x 2>"$tmp/err"; then bad dump_tokens_missing_model
elif grep -q "none.gguf" "$tmp/err"; then ok dump_tokens_missing_model
else bad "dump_tokens_missing_model: message [$(cat "$tmp/err")]"; fi
if "$BIN" -m "$VOCAB" --dump-tokens 2>"$tmp/err"; then bad dump_tokens_no_prompt
elif grep -q "prompt" "$tmp/err"; then ok dump_tokens_no_prompt; else bad dump_tokens_no_prompt; fi
if "$BIN" --bogus 2>"$tmp/err"; then bad cli_unknown_option
elif grep -q -- "--bogus" "$tmp/err"; then ok cli_unknown_option; else bad cli_unknown_option; fi

# 7. --help lists every documented flag
help=$("$BIN" --help)
missing=""
for f in -m -p --prompt-file -n --ctx --think --nothink --think-max --temp --top-p --top-k \
         --min-p --seed --system --threads --dump-tokens --dump-logprobs --logprobs-top-k \
         /help /think /think-max /nothink /ctx /read /save /load /quit; do
    grep -q -- "$f" <<<"$help" || missing="$missing $f"
done
[ -z "$missing" ] && ok cli_help_complete || bad "cli_help_complete: missing$missing"

echo "RESULT $pass $fail $skip"
