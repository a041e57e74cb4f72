# counters_lib.sh - the PASS / FAIL / SKIP counters that the shell tests
# of the programs share, and their scratch folder (sourced after `set -u`,
# from the repository root, where tests/run_tests.sh runs them):
#
#   . tests/counters_lib.sh
#   ok NAME / bad "NAME: why" / skipt "NAME: why", files under $tmp
#   (removed at exit), then echo "RESULT $pass $fail $skip"
pass=0; fail=0; skip=0
ok()   { echo "PASS $1"; pass=$((pass + 1)); }
bad()  { echo "FAIL $1"; fail=$((fail + 1)); }
skipt(){ echo "SKIP $1"; skip=$((skip + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
