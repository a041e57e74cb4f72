#!/usr/bin/env bash
# test_dist_mpi.sh - distributed runs under Open MPI (docs/DISTRIBUTED.md),
# as a user starts them: `mpirun -np N ./ds4 ... --dump-logits` must write
# the same bytes as the one-process run on the golden fixtures (tiny-a and
# rand-b converted with ds4-quantize, the rand-b logits of the independent
# NumPy model checked too) and on a Flash-shaped synthetic model (official
# numerics, q2 experts), for 2 and 3 ranks, full prefill, chunked prefill,
# pure decode and both; --layers per rank (MPMD), 16-bit activations
# (close, not equal); bad layer ranges, a different model file on one rank
# and a missing one refused at start with the rank named; a rank killed in
# the middle ends the job (no hang); the server answers through 2 ranks,
# and its disk-cache snapshot taken over 2 ranks restores in one process
# (and the other way round).
set -u
BIN=${DS4_BIN_DIR:-.}
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }
if ! command -v mpirun >/dev/null 2>&1; then
    echo "SKIP all: mpirun not found (Debian: apt-get install openmpi-bin libopenmpi-dev)"; echo "RESULT 0 0 1"; exit 0
fi
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT

# What Open MPI needs in a container: root allowed (CI runs as root), more
# ranks than cores, no process binding, shared memory without CMA/ptrace.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_plm_rsh_agent=false
# sanitizer builds: Open MPI's own allocations are not ours to report
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0}
MPI=(mpirun --oversubscribe --bind-to none)
T=timeout

for f in tiny-a:dsv4-tiny-a rand-b:dsv4-rand-b; do
    "$BIN/ds4-quantize" --hf "tests/data/${f#*:}" --out "$tmp/${f%%:*}.gguf" --type f32 --experts f32 >"$tmp/q.log" 2>&1 ||
        { bad "convert ${f#*:}: $(tail -2 "$tmp/q.log")"; echo "RESULT $pass $fail $skip"; exit 1; }
done
"$BIN/ds4-quantize" --synthetic tests/data/stream/flash-shaped.json --out "$tmp/flash.gguf" --quiet --threads 2 \
    2>"$tmp/q.log" || { bad "synthetic model: $(cat "$tmp/q.log")"; echo "RESULT $pass $fail $skip"; exit 1; }
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
a = json.load(open('tests/data/dsv4-tiny-a/manifest.json'))['sequences'][0]['tokens'][:200]
b = json.load(open('tests/data/dsv4-rand-b/manifest.json'))['sequences'][0]['tokens']
open(d + '/tiny-a.ids', 'w').write(' '.join(map(str, a)))
open(d + '/rand-b.ids', 'w').write(' '.join(map(str, b)))
open(d + '/flash.ids', 'w').write(' '.join(str(1000 + 37 * i) for i in range(48)))
PY

one() { # model chunk decode_from out
    "$BIN/ds4" -m "$tmp/$1.gguf" --token-ids "$tmp/$1.ids" --threads 1 --prefill-chunk "$2" --decode-from "$3" \
        --dump-logits "$4"
}
dist() { # ranks model chunk decode_from out [extra...]
    local n=$1 m=$2 c=$3 k=$4 o=$5; shift 5
    $T 120 "${MPI[@]}" -np "$n" "$BIN/ds4" -m "$tmp/$m.gguf" --token-ids "$tmp/$m.ids" --threads 1 \
        --prefill-chunk "$c" --decode-from "$k" --dump-logits "$o" "$@"
}

# 1. bit for bit: ranks x model x schedule (chunk, decode-from); each
# mpirun costs ~2 s of start-up, so tiny-a gets every schedule on 2 and 3
# ranks and rand-b two of them on 3 ranks
same=1; detail=""
for run in "tiny-a 200 200 2 3" "tiny-a 7 200 2 3" "tiny-a 64 150 2 3" "tiny-a 16 1 2" "tiny-a 300 100 3" \
           "rand-b 7 200 3" "rand-b 16 1 3"; do
    set -- $run
    m=$1 c=$2 k=$3; shift 3
    one $m $c $k "$tmp/ref" 2>"$tmp/err" || { same=0; detail="$detail [$m one $c/$k: $(tail -1 "$tmp/err")]"; continue; }
    for n in "$@"; do
        if ! dist $n $m $c $k "$tmp/out" 2>"$tmp/err"; then same=0; detail="$detail [$m np $n $c/$k failed: $(grep ds4 "$tmp/err" | head -2)]"
        elif ! cmp -s "$tmp/out" "$tmp/ref"; then same=0; detail="$detail [$m np $n $c/$k differs]"; fi
    done
    [ $m = rand-b ] && [ $c = 7 ] && cp "$tmp/out" "$tmp/rand-b.dist"
done
[ $same = 1 ] && ok dist_logits_bit_identical_2_3_ranks_all_schedules || bad "dist_logits_bit_identical_2_3_ranks_all_schedules:$detail"

# 2. the distributed rand-b logits against the NumPy model of the spec
if python3 - "$tmp/rand-b.dist" <<'PY'
import array, sys
a = array.array('f'); a.frombytes(open(sys.argv[1], 'rb').read())
b = array.array('f'); b.frombytes(open('tests/data/dsv4-rand-b/logits0.f32', 'rb').read())
assert len(a) == len(b), (len(a), len(b))
d = max(abs(x - y) for x, y in zip(a, b))
print(f"   rand-b over 3 ranks vs the NumPy reference: max |dlogit| {d:.2e}")
sys.exit(0 if d <= 1e-3 else 1)
PY
then ok dist_rand_b_matches_numpy_reference; else bad dist_rand_b_matches_numpy_reference; fi

# 3. Flash-shaped (official numerics, q2 experts, hash layers), 2 ranks
one flash 8 20 "$tmp/ref" 2>/dev/null
dist 2 flash 8 20 "$tmp/out" 2>"$tmp/err" && cmp -s "$tmp/out" "$tmp/ref" && ok dist_flash_shaped_official_bit_identical ||
    bad "dist_flash_shaped_official_bit_identical: $(grep ds4 "$tmp/err" | head -2)"

# 4. --layers per rank (uneven, MPMD command line)
one tiny-a 16 150 "$tmp/ref" 2>/dev/null
A=(-m "$tmp/tiny-a.gguf" --token-ids "$tmp/tiny-a.ids" --threads 1 --prefill-chunk 16 --decode-from 150 --dump-logits "$tmp/out")
$T 120 "${MPI[@]}" -np 1 "$BIN/ds4" "${A[@]}" --layers 0:1 : -np 1 "$BIN/ds4" "${A[@]}" --layers 1:5 : \
    -np 1 "$BIN/ds4" "${A[@]}" --layers 5:6 2>"$tmp/err" && cmp -s "$tmp/out" "$tmp/ref" &&
    ok dist_layers_per_rank_bit_identical || bad "dist_layers_per_rank_bit_identical: $(grep ds4 "$tmp/err" | head -2)"

# 5. 16-bit activations: bf16 rounding at one hop, close to the exact run
if dist 2 tiny-a 16 150 "$tmp/out" --dist-activation-bits 16 2>"$tmp/err" && python3 - "$tmp/out" "$tmp/ref" <<'PY'
import array, sys
a = array.array('f'); a.frombytes(open(sys.argv[1], 'rb').read())
b = array.array('f'); b.frombytes(open(sys.argv[2], 'rb').read())
d = [abs(x - y) for x, y in zip(a, b)]
print(f"   16-bit activations, 2 ranks: max |dlogit| {max(d):.3g}, mean {sum(d) / len(d):.3g}")
sys.exit(0 if len(a) == len(b) and 0 < max(d) < 0.5 else 1)
PY
then ok dist_16bit_activations_close; else bad "dist_16bit_activations_close: $(grep ds4 "$tmp/err" | head -2)"; fi

# 6. refused at start, with the cause and the rank named, no hang
expect_err() { # name pattern mpirun-args...
    local name=$1 pat=$2; shift 2
    $T 60 "${MPI[@]}" "$@" >"$tmp/o" 2>"$tmp/err"; local rc=$?
    if [ $rc -eq 0 ]; then bad "$name: accepted"
    elif [ $rc -eq 124 ]; then bad "$name: hung (killed after 60 s)"
    elif grep -q -- "$pat" "$tmp/err"; then ok "$name"
    else bad "$name: rc $rc [$(head -3 "$tmp/err")]"; fi
}
expect_err dist_refuses_layer_gap "rank 1 has layers 3:6, but the ranks before it end at layer 2" \
    -np 1 "$BIN/ds4" "${A[@]}" --layers 0:2 : -np 1 "$BIN/ds4" "${A[@]}" --layers 3:6
# (every other bad combination of ranges: tests/test_dist_plan.c)
expect_err dist_refuses_other_model_file "rank 1 (.*): model file .* is not the one rank 0 opened" \
    -np 1 "$BIN/ds4" "${A[@]}" : -np 1 -x DS4_DIST_MODEL="$tmp/rand-b.gguf" "$BIN/ds4" "${A[@]}"
expect_err dist_reports_missing_file_on_a_rank "rank 2 (.*): .*nothere.gguf: cannot open" \
    -np 2 "$BIN/ds4" "${A[@]}" : -np 1 -x DS4_DIST_MODEL="$tmp/nothere.gguf" "$BIN/ds4" "${A[@]}"
# options checked before MPI starts: no mpirun needed
plain_err() { # name pattern args...
    local name=$1 pat=$2; shift 2
    if "$BIN/ds4" "$@" 2>"$tmp/err"; then bad "$name: accepted"
    elif grep -q -- "$pat" "$tmp/err"; then ok "$name"
    else bad "$name: $(cat "$tmp/err")"; fi
}
plain_err dist_refuses_bad_activation_bits "takes 32 or 16" "${A[@]}" --dist-activation-bits 8
plain_err dist_refuses_bad_layers_syntax "expected A:B" "${A[@]}" --layers 4:2
plain_err dist_layers_need_mpirun "start it with mpirun" "${A[@]}" --layers 0:6

# 7. a rank that dies in the middle (SIGKILL at its first chunk) ends the job
$T 60 "${MPI[@]}" -x DS4_DIST_TEST_DIE_RANK=1 -np 3 "$BIN/ds4" "${A[@]}" >"$tmp/o" 2>"$tmp/err"; rc=$?
if [ $rc -eq 124 ]; then bad "dist_dead_rank_ends_job: hung"
elif [ $rc -ne 0 ] && grep -q "process rank 1 .*signal 9" "$tmp/err"; then ok "dist_dead_rank_ends_job (exit $rc)"
else bad "dist_dead_rank_ends_job: rc $rc [$(head -5 "$tmp/err")]"; fi

# 8. the server through 2 ranks; its disk snapshot restores in one process
demo=models/ds4-demo.gguf
if ! command -v curl >/dev/null 2>&1; then echo "SKIP server: curl not installed"; skip=$((skip + 1))
elif [ ! -f "$demo" ]; then echo "SKIP server: $demo not found"; skip=$((skip + 1))
else
    serve() { # name kvdir launcher...
        local name=$1 kv=$2; shift 2
        "$@" "$BIN/ds4-server" -m "$demo" --port 0 --ctx 512 -t 1 --kv-disk-dir "$kv" --kv-cache-min-tokens 1 \
            >"$tmp/$name.out" 2>"$tmp/$name.err" &
        pids+=($!)
        for _ in $(seq 1 300); do grep -q '^listening' "$tmp/$name.out" 2>/dev/null && break; sleep 0.1; done
        port=$(sed -n 's/^listening //p' "$tmp/$name.out")
    }
    stop() { kill "${pids[${#pids[@]}-1]}" 2>/dev/null; wait "${pids[${#pids[@]}-1]}" 2>/dev/null; unset 'pids[${#pids[@]}-1]'; }
    ask() { # out
        curl -s -m 60 -o "$1" "http://127.0.0.1:$port/v1/chat/completions" -H 'content-type: application/json' \
            -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":12,"temperature":0,"thinking":false}'
    }
    field() { python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['choices'][0]['message']['content'] + '|' + j.get('ds4', {}).get('cache', '?'))" "$1" 2>/dev/null; }
    mkdir -p "$tmp/kv1" "$tmp/kv2"
    serve one "$tmp/kv1"; ask "$tmp/one.json"; stop
    serve dist "$tmp/kv2" $T 120 "${MPI[@]}" -np 2; ask "$tmp/dist.json"; stop
    a=$(field "$tmp/one.json"); b=$(field "$tmp/dist.json")
    echo "   one process: [$a]  2 ranks: [$b]"
    [ -n "$a" ] && [ "${a%|*}" = "${b%|*}" ] && [ "${b#*|}" = cold ] && ok dist_server_answers_through_2_ranks ||
        bad "dist_server_answers_through_2_ranks: [$(head -c 300 "$tmp/dist.json")] $(grep -h ds4 "$tmp/dist.err" | head -3)"
    # the 2-rank server's snapshot, in one process; the one-process one, over 2 ranks
    serve one2 "$tmp/kv2"; ask "$tmp/one2.json"; stop
    serve dist2 "$tmp/kv1" $T 120 "${MPI[@]}" -np 2; ask "$tmp/dist2.json"; stop
    c=$(field "$tmp/one2.json"); d=$(field "$tmp/dist2.json")
    echo "   restored: 2-rank snapshot in one process [$c], one-process snapshot over 2 ranks [$d]"
    [ "${c%|*}" = "${a%|*}" ] && [ "${c#*|}" = disk ] && ok dist_snapshot_restores_in_one_process ||
        bad "dist_snapshot_restores_in_one_process: [$c] $(grep -h ds4 "$tmp/one2.err" | head -3)"
    [ "${d%|*}" = "${a%|*}" ] && [ "${d#*|}" = disk ] && ok dist_one_process_snapshot_restores_over_2_ranks ||
        bad "dist_one_process_snapshot_restores_over_2_ranks: [$d] $(grep -h ds4 "$tmp/dist2.err" | head -3)"
    # two requests at once (--parallel 2): their decode steps go through
    # the ranks as one batched step per stage; the answers equal one process's
    ask2() { # name
        local q cs=()
        for q in "What is the capital of Italy?" "Say hello."; do
            curl -s -m 60 -o "$tmp/$1-${#q}.json" "http://127.0.0.1:$port/v1/chat/completions" \
                -H 'content-type: application/json' \
                -d "{\"messages\":[{\"role\":\"user\",\"content\":\"$q\"}],\"max_tokens\":16,\"temperature\":0,\"thinking\":false}" &
            cs+=($!)
        done
        wait "${cs[@]}"
    }
    "$BIN/ds4-server" -m "$demo" --port 0 --ctx 512 -t 1 --parallel 2 >"$tmp/p1.out" 2>"$tmp/p1.err" & pids+=($!)
    for _ in $(seq 1 300); do grep -q '^listening' "$tmp/p1.out" 2>/dev/null && break; sleep 0.1; done
    port=$(sed -n 's/^listening //p' "$tmp/p1.out"); ask2 p1; stop
    $T 120 "${MPI[@]}" -x DS4_DIST_VERBOSE=1 -np 2 "$BIN/ds4-server" -m "$demo" --port 0 --ctx 512 -t 1 --parallel 2 >"$tmp/p2.out" \
        2>"$tmp/p2.err" & pids+=($!)
    for _ in $(seq 1 300); do grep -q '^listening' "$tmp/p2.out" 2>/dev/null && break; sleep 0.1; done
    port=$(sed -n 's/^listening //p' "$tmp/p2.out"); ask2 p2; stop
    same=1
    for f in "$tmp"/p1-*.json; do
        g="$tmp/p2-${f##*/p1-}"
        x=$(field "$f"); y=$(field "$g")
        echo "   parallel: one process [${x%|*}]  2 ranks [${y%|*}]"
        [ -n "$x" ] && [ "${x%|*}" = "${y%|*}" ] || same=0
    done
    # the line said at the first batched step (the exit summary may be cut
    # short: mpirun kills a rank that takes long to shut down)
    steps=$(sed -n 's/.*first decode step of \([0-9]*\) sessions at once.*/\1/p' "$tmp/p2.err" | head -1)
    echo "   $(grep 'at once\|batched decode steps' "$tmp/p2.err" | tr '\n' ' ')"
    [ $same = 1 ] && [ "${steps:-0}" -gt 1 ] && ok dist_server_parallel_requests_batched_same_answers ||
        bad "dist_server_parallel_requests_batched_same_answers: sessions in one step ${steps:-none}; $(grep -h ds4 "$tmp/p2.err" | head -3)"
fi

echo "RESULT $pass $fail $skip"
[ "$fail" -eq 0 ]
