#!/usr/bin/env bash
# Runs every test binary given on the command line from the repository root,
# adds up their RESULT lines and prints the suite summary "N passed, N failed".
# A binary that crashes or prints no RESULT line counts as one failure.
set -u
passed=0; failed=0; skipped=0; crashed=""
for t in "$@"; do
    echo "== $t"
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out" | grep -v '^RESULT ' 
    res=$(printf '%s\n' "$out" | grep '^RESULT ' | tail -1)
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
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
