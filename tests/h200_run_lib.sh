# h200_run_lib.sh - what the shell tests of bench/h200_run.sh share
# (sourced from tests/test_h200_run_*.sh, run from the repository root):
# the PASS / FAIL counters, a scratch folder removed at exit, and the
# closing RESULT line (the script's exit status: 0 when nothing failed).
#
#   . tests/h200_run_lib.sh
#   ok NAME / bad NAME WHY ... in "$tmp", then h2_result
pass=0; fail=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
h2_result() {
    echo "RESULT $pass $fail 0"
    [ "$fail" -eq 0 ]
}
