#!/usr/bin/env bash
# test_version.sh - `--version` on every binary the Makefile builds (each
# <dir>/<name>_main.c): exit 0, one line "NAME X.Y.Z (commit C, backends:
# cpu[...]...)" on stdout, C the `git describe` of this checkout (when it
# is one), and nothing else run (no model is needed, no error printed).
# Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
commit=$(git describe --always --dirty --abbrev=12 2>/dev/null || true)
for main in */*_main.c; do
    name=$(basename "$main" _main.c | tr _ -)
    bin="${DS4_BIN_DIR:-.}/$name"
    if [ ! -x "$bin" ]; then echo "SKIP $name: not built"; skip=$((skip + 1)); continue; fi
    out=$("$bin" --version 2>/tmp/ds4-version-err.$$); rc=$?
    err=$(cat /tmp/ds4-version-err.$$); rm -f /tmp/ds4-version-err.$$
    if [ $rc -ne 0 ] || [ -n "$err" ]; then bad "$name" "rc=$rc stderr='$err'"; continue; fi
    if ! printf '%s\n' "$out" | grep -Eq "^$name [0-9]+\.[0-9]+\.[0-9]+ \(commit [^,]+, backends: cpu\[scalar avx2 avx512\]( cuda)?\)$" ||
       [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ]; then
        bad "$name" "unexpected output '$out'"; continue
    fi
    # the commit the binary was built from; a build of an older tree (the
    # checkout moved since `make`) would say another one
    if [ -n "$commit" ] && ! printf '%s\n' "$out" | grep -q "(commit ${commit%-dirty}"; then
        bad "$name" "commit in '$out' is not $commit"; continue
    fi
    ok "$name"
done
echo "RESULT $pass $fail $skip"
[ "$fail" -eq 0 ]
