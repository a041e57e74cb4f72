#!/usr/bin/env bash
# test_build_config.sh - the Makefile's configuration stamp: an object
# built under one configuration is up to date under the same one and
# rebuilt under another (other flags; CUDA on or off is the same variable
# to make), so a build folder is never linked from objects of two
# configurations. One small object in a scratch build folder; no GPU
# needed. Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
. tests/counters_lib.sh
if ! command -v make >/dev/null 2>&1 || ! command -v "${CC:-cc}" >/dev/null 2>&1; then
    skipt "all: no make or C compiler"
    echo "RESULT $pass $fail $skip"
    exit 0
fi
b=$tmp/b
obj=$b/util/error.o
# the outer make's jobserver and flags are not this make's
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory NO_CUDA=1 BUILD="$b" "$@"; }
if mk "$obj" > "$tmp/build.log" 2>&1 && [ -f "$obj" ]; then ok "the object builds"; else bad "build: $(tail -3 "$tmp/build.log")"; fi
mk -q "$obj" > /dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && ok "up to date under the same configuration" || bad "same configuration: make -q rc $rc (want 0)"
mk -q EXTRA_CFLAGS=-DDS4_BUILD_CONFIG_TEST "$obj" > /dev/null 2>&1; rc=$?
[ $rc -eq 1 ] && ok "out of date under other flags" || bad "other flags: make -q rc $rc (want 1)"
grep -q 'cflags=.*-DDS4_BUILD_CONFIG_TEST' "$b/config.stamp" && ok "the stamp names the new flags" ||
    bad "stamp: '$(cat "$b/config.stamp")'"
out=$(mk EXTRA_CFLAGS=-DDS4_BUILD_CONFIG_TEST "$obj" 2>&1)
printf '%s' "$out" | grep -q -- '-DDS4_BUILD_CONFIG_TEST.*-c util/error.c' && ok "rebuilt with them" ||
    bad "rebuild: '$out'"
mk -q EXTRA_CFLAGS=-DDS4_BUILD_CONFIG_TEST "$obj" > /dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && ok "then up to date" || bad "after the rebuild: make -q rc $rc (want 0)"
mk -q "$obj" > /dev/null 2>&1; rc=$?
[ $rc -eq 1 ] && ok "out of date again under the first flags" || bad "back: make -q rc $rc (want 1)"
echo "RESULT $pass $fail $skip"
[ "$fail" = 0 ]
