#!/usr/bin/env bash
# Runs the SDK client tests (tests/node/*.test.mjs: the official `openai` and
# `@anthropic-ai/sdk` npm packages against a ds4-server on loopback) and
# turns node's "# pass N / # fail N / # skipped N" summary into our
# harness's "RESULT p f s" line. The packages (the official SDKs and the
# Claude Code and Codex agent clients) come from `npm ci` in tests/node
# (the committed package-lock.json), run here when needed; without node or
# npm the suite is skipped with the reason printed.
set -u
cd "$(dirname "$0")/.."
bin="${DS4_BIN_DIR:-.}/ds4-server"
if ! command -v node >/dev/null 2>&1; then
    echo "skip: node is not installed"; echo "RESULT 0 0 1"; exit 0
fi
# The pinned clients (package-lock.json) are installed here, by `make test`
# itself: when node_modules is missing or older than the lock file.
if ! command -v npm >/dev/null 2>&1; then
    echo "skip: npm is not installed (node is; the SDK and agent clients come from npm)"; echo "RESULT 0 0 1"; exit 0
fi
if [ ! -f tests/node/node_modules/.package-lock.json ] || \
   [ tests/node/package-lock.json -nt tests/node/node_modules/.package-lock.json ]; then
    echo "npm ci in tests/node (the pinned SDKs and agent clients)"
    if ! (cd tests/node && npm ci --no-audit --no-fund --loglevel=error) >"${TMPDIR:-/tmp}/ds4-npm-ci.log" 2>&1; then
        echo "fail: npm ci in tests/node failed:"; tail -20 "${TMPDIR:-/tmp}/ds4-npm-ci.log"
        echo "RESULT 0 1 0"; exit 1
    fi
fi
if [ ! -d tests/node/node_modules/openai ] || [ ! -d tests/node/node_modules/@anthropic-ai/sdk ]; then
    echo "skip: tests/node/node_modules has no SDKs after npm ci"; echo "RESULT 0 0 1"; exit 0
fi
if [ ! -x "$bin" ]; then
    echo "fail: $bin not built"; echo "RESULT 0 1 0"; exit 1
fi
# A small real model for tests/node/model.test.mjs: synthetic weights with
# the real tokenizer, the tiny fixture's config widened so that the
# official numerics apply (64 non-RoPE KV dims, 128-dim indexer keys).
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
quant="${DS4_BIN_DIR:-.}/ds4-quantize"
if [ -x "$quant" ]; then
    node -e '
        const fs = require("fs");
        const c = JSON.parse(fs.readFileSync("tests/data/dsv4-tiny-a/config.json", "utf8"));
        Object.assign(c, { vocab_size: 129280, head_dim: 128, qk_rope_head_dim: 64,
                           partial_rotary_factor: 0.5, index_head_dim: 128 });
        for (const k of ["main", "compress"]) c.rope_parameters[k].partial_rotary_factor = 0.5;
        fs.writeFileSync(process.argv[1], JSON.stringify(c));' "$tmp/config.json"
    if "$quant" --synthetic "$tmp/config.json" --tokenizer tests/data/tokenizer/dsv4-vocab.gguf \
            --out "$tmp/model.gguf" --experts q8_0 --layers 3 --n-experts 4 --quiet 2>"$tmp/err"; then
        export DS4_TEST_MODEL="$tmp/model.gguf"
    else
        echo "note: building the test model failed, model tests skip: $(cat "$tmp/err")"
    fi
fi
out=$(node --test --test-concurrency=1 tests/node/*.test.mjs 2>&1); rc=$?
printf '%s\n' "$out" | grep -E '^(not ok|ok) |^# Subtest' | grep -v '^# Subtest' | sed 's/^/  /'
printf '%s\n' "$out" | grep -A20 '^not ok' | head -80
pass=$(printf '%s\n' "$out" | sed -n 's/^# pass \([0-9]*\)$/\1/p' | tail -1)
fail=$(printf '%s\n' "$out" | sed -n 's/^# fail \([0-9]*\)$/\1/p' | tail -1)
skip=$(printf '%s\n' "$out" | sed -n 's/^# skipped \([0-9]*\)$/\1/p' | tail -1)
cancel=$(printf '%s\n' "$out" | sed -n 's/^# cancelled \([0-9]*\)$/\1/p' | tail -1)
if [ -z "$pass" ] || [ -z "$fail" ]; then
    printf '%s\n' "$out" | tail -20
    echo "RESULT 0 1 0"; exit 1
fi
fail=$((fail + ${cancel:-0}))
[ "$rc" -ne 0 ] && [ "$fail" -eq 0 ] && fail=1
echo "RESULT $pass $fail ${skip:-0}"
[ "$fail" -eq 0 ]
