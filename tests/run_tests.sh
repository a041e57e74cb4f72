#!/usr/bin/env bash
# Runs every test binary given on the command line from the repository root,
# adds up their RESULT lines and prints the suite summary "N passed, N failed".
# A binary that crashes or prints no RESULT line counts as one failure.
# Each one's wall time follows its output, and the slowest five are listed
# before the summary, so a suite creeping toward CI's 30 minutes shows where.
set -u
passed=0; failed=0; skipped=0; crashed=""
times=""
now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
for t in "$@"; do
    echo "== $t"
    t0=$(now_ms)
    out=$("$t" 2>&1); rc=$?
    ms=$(( $(now_ms) - t0 ))
    times="$times$ms $t
"
    printf '%s\n' "$out" | grep -v '^RESULT ' 
    res=$(printf '%s\n' "$out" | grep '^RESULT ' | tail -1)
    printf '   (%d.%d s)\n' $((ms / 1000)) $((ms % 1000 / 100))
    if [ -z "$res" ]; then
        echo "   $t: no RESULT line (exit $rc): counted as a failure"
        failed=$((failed + 1)); crashed="$crashed $t"; continue
    fi
    set -- $res
    passed=$((passed + $2)); failed=$((failed + $3)); skipped=$((skipped + $4))
    if [ "$rc" -ne 0 ] && [ "$3" -eq 0 ]; then
        echo "   $t: exit $rc with no failed test: counted as a failure"
        failed=$((failed + 1)); crashed="$crashed $t"
    fi
done
[ -n "$crashed" ] && echo "crashed or bad exit:$crashed"
echo "slowest:"
printf '%s' "$times" | sort -rn | head -5 | while read -r ms t; do
    printf '   %6d.%d s  %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$t"
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
