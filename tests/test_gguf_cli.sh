#!/usr/bin/env bash
# test_gguf_cli.sh - `ds4-gguf info` on the vocab fixture and on broken files.
# Valid file: exit 0 and tokenizer.ggml.tokens listed with 129280 entries.
# Broken files: exit status 1 (not a signal), exactly one line on stderr
# naming the cause. Prints "RESULT passed failed skipped".
set -u
BIN="${DS4_BIN_DIR:-.}/ds4-gguf"
VOCAB=tests/data/tokenizer/dsv4-vocab.gguf
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

if [ ! -x "$BIN" ]; then
    echo "SKIP all: $BIN not built"; echo "RESULT 0 0 1"; exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

out=$("$BIN" info "$VOCAB" 2>"$tmp/err"); rc=$?
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -Eq 'arr\[str,129280\] +tokenizer\.ggml\.tokens = \["<｜begin▁of▁sentence｜>"'; then
    ok vocab_tokens
else
    bad vocab_tokens "rc=$rc, no tokens line"
fi
if printf '%s\n' "$out" | grep -Eq 'u32 +deepseek4\.vocab_size = 129280$' &&
   printf '%s\n' "$out" | grep -Eq 'arr\[str,127741\] +tokenizer\.ggml\.merges' &&
   printf '%s\n' "$out" | grep -q '^\* Tensors: 0$'; then
    ok vocab_other_lines
else
    bad vocab_other_lines "missing vocab_size/merges/tensor lines"
fi

"$BIN" --help >"$tmp/help" 2>&1 && grep -q 'usage: ds4-gguf info' "$tmp/help" && ok help || bad help "--help"
"$BIN" >/dev/null 2>&1; rc=$?; [ $rc -eq 2 ] && ok usage_no_args || bad usage_no_args "rc=$rc"

# broken files: name, bytes, expected words in the message
head -c 100000 "$VOCAB" >"$tmp/truncated.gguf"
printf 'GGML\3\0\0\0' >"$tmp/magic.gguf"
: >"$tmp/empty.gguf"
# version 3, 0 tensors, 2^40 KVs
printf 'GGUF\3\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\1\0\0' >"$tmp/hugecount.gguf"
# 1 KV whose key has an invalid UTF-8 byte
printf 'GGUF\3\0\0\0\0\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\2\0\0\0\0\0\0\0a\377\4\0\0\0\1\0\0\0' >"$tmp/utf8.gguf"
# 1 KV with value type 99
printf 'GGUF\3\0\0\0\0\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0\1\0\0\0\0\0\0\0k\143\0\0\0\0\0\0\0' >"$tmp/vtype.gguf"
check_bad() {
    local name=$1 want=$2
    "$BIN" info "$tmp/$name.gguf" >/dev/null 2>"$tmp/err"; local rc=$?
    local lines; lines=$(wc -l <"$tmp/err")
    if [ $rc -ne 1 ]; then bad "bad_$name" "exit $rc (want 1)"
    elif [ "$lines" -ne 1 ]; then bad "bad_$name" "$lines lines on stderr"
    elif ! grep -q "$want" "$tmp/err"; then bad "bad_$name" "'$want' not in: $(cat "$tmp/err")"
    else ok "bad_$name"; fi
}
check_bad truncated 'truncated.*offset'
check_bad magic 'bad magic'
check_bad empty 'truncated.*offset 0'
check_bad hugecount 'kv count 1099511627776 at offset 16 is too large'
check_bad utf8 'not valid UTF-8.*offset 33'
check_bad vtype 'bad value type id 99.*offset 33'
"$BIN" info "$tmp/does-not-exist.gguf" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 1 ] && grep -q 'cannot open' "$tmp/err" && ok missing_file || bad missing_file "rc=$rc"

echo "RESULT $pass $fail $skip"
