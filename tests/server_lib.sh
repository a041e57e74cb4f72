# server_lib.sh - what the shell tests that run ds4-server share (sourced
# from tests/test_server_*.sh): the skip checks, the PASS / FAIL counters,
# starting servers on free ports (on the demo model, or the test engine)
# and stopping them at exit, and counting the PASS / FAIL lines a node
# check printed.
#
#   . tests/server_lib.sh
#   srv_need curl node        # skip (RESULT 0 0 1) without them, the demo model or fail without the binary
#   srv_need_tools curl node  # the same without the demo model (the test engine needs none)
#   srv_start NAME [VAR=VALUE ...] -- FLAGS...   # sets port_NAME; logs in $tmp/NAME.out / .err
#   srv_start_test NAME FLAGS...                 # the same on --test-engine (unless FLAGS has -m)
#   ok NAME / bad NAME WHY, then srv_result
bin="${DS4_BIN_DIR:-.}/ds4-server"
model=models/ds4-demo.gguf
pass=0; fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }

srv_skip_without() {
    local tool
    for tool in "$@"; do
        if ! command -v "$tool" >/dev/null 2>&1; then echo "skip: $tool is not installed"; echo "RESULT 0 0 1"; exit 0; fi
    done
}
srv_fail_unbuilt() { [ -x "$bin" ] || { echo "fail: $bin not built"; echo "RESULT 0 1 0"; exit 1; }; }
srv_need() {
    srv_skip_without "$@"
    [ -f "$model" ] || { echo "skip: $model missing"; echo "RESULT 0 0 1"; exit 0; }
    srv_fail_unbuilt
}
srv_need_tools() { srv_skip_without "$@"; srv_fail_unbuilt; }

tmp=$(mktemp -d)
srv_pids=()
# KEEP=1 keeps the logs and answers for a look after a failure
srv_cleanup() {
    local p
    for p in "${srv_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    if [ -n "${KEEP:-}" ]; then echo "kept $tmp"; else rm -rf "$tmp"; fi
}
trap srv_cleanup EXIT

# srv_start NAME [VAR=VALUE ...] -- FLAGS...: the demo model on the CPU
# backend, a free port (port_NAME, empty when it did not come up in 20 s)
srv_start() {
    local name=$1; shift
    local envs=(DS4_BACKEND=cpu)
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ "${1:-}" = -- ] && shift
    env "${envs[@]}" "$bin" -m "$model" --port 0 --threads 2 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    srv_pids+=($!)
    srv_port "$name" 200
}

# srv_start_test NAME FLAGS...: --test-engine (one token per byte, docs/SERVER.md
# "Test engine") unless FLAGS has -m; port_NAME as srv_start, within 10 s
srv_start_test() {
    local name=$1; shift
    local engine=--test-engine
    case " $* " in *" -m "*) engine= ;; esac
    "$bin" $engine --port 0 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
    srv_pids+=($!)
    srv_port "$name" 100
}

# srv_port NAME TRIES: port_NAME from NAME's "listening PORT" line, waiting
# up to TRIES tenths of a second for it (empty when it did not come)
srv_port() {
    local _
    for _ in $(seq 1 "$2"); do grep -q '^listening' "$tmp/$1.out" 2>/dev/null && break; sleep 0.1; done
    eval "port_$1=$(sed -n 's/^listening //p' "$tmp/$1.out")"
}

# srv_ask NAME PORT ROUND: four capital-city questions at once, greedy (and,
# with SRV_ASK_SAMPLED=1, a fifth request: the second question sampled at
# temperature 0.8, seed 7), answers to $tmp/NAME.ROUND.I.json
srv_prompts=("What is the capital of France?" "What is the capital of Japan?" "What is the capital of Italy?"
             "What is the capital of Spain?")
srv_ask() {
    local i
    for i in 0 1 2 3; do
        curl -s -o "$tmp/$1.$3.$i.json" "http://127.0.0.1:$2/v1/chat/completions" -H 'content-type: application/json' \
            -d "{\"model\":\"deepseek-chat\",\"temperature\":0,\"max_tokens\":40,\"messages\":[{\"role\":\"user\",\"content\":\"${srv_prompts[$i]}\"}]}" &
    done
    [ -n "${SRV_ASK_SAMPLED:-}" ] && curl -s -o "$tmp/$1.$3.4.json" "http://127.0.0.1:$2/v1/chat/completions" \
        -H 'content-type: application/json' \
        -d "{\"model\":\"deepseek-chat\",\"temperature\":0.8,\"seed\":7,\"max_tokens\":40,\"messages\":[{\"role\":\"user\",\"content\":\"${srv_prompts[1]}\"}]}" &
    wait
}
# srv_rounds A B: srv_ask on server A, then on server B, twice (rounds 1, 2)
srv_rounds() {
    local round
    for round in 1 2; do
        # the waits of srv_ask would wait on the servers too: a subshell each
        ( srv_ask "$1" "$(eval echo "\$port_$1")" $round ) ; ( srv_ask "$2" "$(eval echo "\$port_$2")" $round )
    done
}

# srv_count FILE: echo FILE's lines, counting its PASS / FAIL ones
srv_count() {
    local line
    while IFS= read -r line; do
        case "$line" in
            PASS*) echo "$line"; pass=$((pass + 1)) ;;
            FAIL*) echo "$line"; fail=$((fail + 1)) ;;
            *) echo "$line" ;;
        esac
    done <"$1"
}

srv_result() { echo "RESULT $pass $fail 0"; [ "$fail" -eq 0 ]; }
