#!/usr/bin/env bash
# test_check_deps.sh - scripts/check_deps.sh, the step `make` runs first, on
# a machine where one dependency is missing. A compiler wrapper hides one
# header (as if its -dev package were removed); the script must name
# exactly that package: in one line when it may not install, or in the
# apt-get install it runs (a stand-in apt-get on PATH records the call).
# Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
pass=0; fail=0; skip=0
ok()  { echo "PASS $1"; pass=$((pass + 1)); }
bad() { echo "FAIL $1: $2"; fail=$((fail + 1)); }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
real_cc=${CC:-cc}
if ! command -v "$real_cc" >/dev/null 2>&1; then echo "SKIP all: no $real_cc"; echo "RESULT 0 0 1"; exit 0; fi

# cc that cannot find utf8proc.h
cat > "$tmp/cc-no-utf8proc" <<EOS
#!/usr/bin/env bash
src=\$(cat)
case "\$src" in *utf8proc.h*) echo "fatal error: utf8proc.h: No such file or directory" >&2; exit 1 ;; esac
printf '%s\n' "\$src" | exec $real_cc "\$@"
EOS
chmod +x "$tmp/cc-no-utf8proc"

out=$(scripts/check_deps.sh "$real_cc" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ -z "$out" ]; then ok all_present; else bad all_present "rc=$rc out='$out'"; fi

out=$(DS4_NO_INSTALL=1 scripts/check_deps.sh "$tmp/cc-no-utf8proc" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$out" = "missing build dependencies: install them with: apt-get install libutf8proc-dev" ]; then
    ok names_the_package
else
    bad names_the_package "rc=$rc out='$out'"
fi

out=$(DS4_NO_INSTALL=1 scripts/check_deps.sh /nonexistent/cc 2>&1); rc=$?
if [ $rc -eq 1 ] && printf '%s' "$out" | grep -q "apt-get install build-essential libjansson-dev"; then
    ok no_compiler
else
    bad no_compiler "rc=$rc out='$out'"
fi

# the install path: as root apt-get runs directly, otherwise through sudo
mkdir -p "$tmp/bin"
cat > "$tmp/bin/apt-get" <<EOS
#!/usr/bin/env bash
echo "\$*" >> "$tmp/apt.log"
EOS
cat > "$tmp/bin/sudo" <<EOS
#!/usr/bin/env bash
echo "sudo" >> "$tmp/apt.log"
exec "\$@"
EOS
chmod +x "$tmp/bin/apt-get" "$tmp/bin/sudo"
out=$(PATH="$tmp/bin:$PATH" scripts/check_deps.sh "$tmp/cc-no-utf8proc" 2>&1); rc=$?
log=$(cat "$tmp/apt.log" 2>/dev/null)
if [ $rc -eq 0 ] && printf '%s\n' "$log" | grep -q -- "install -y -qq --no-install-recommends libutf8proc-dev$" &&
   { [ "$(id -u)" -ne 0 ] || ! printf '%s\n' "$log" | grep -q '^sudo$'; }; then
    ok installs_the_package
else
    bad installs_the_package "rc=$rc out='$out' apt='$log'"
fi
echo "RESULT $pass $fail $skip"
[ "$fail" -eq 0 ]
