#!/usr/bin/env bash
# test_h200_run_switches.sh - bench/h200_run.sh's configuration switches:
# every "nameN DS4_...=N" its header documents sets that variable to 0 and
# 1 (cfg_env), and a configuration with a switch it does not know is
# refused (exit 2, the switch named) before any step runs: a misspelt
# switch once measured the defaults under another name (docs/BENCHMARKS.md,
# twenty-third session). No GPU needed. Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
. tests/h200_run_lib.sh
script=bench/h200_run.sh
eval "$(sed -n '/^cfg_env() {/,/^}/p' "$script")"
# the documented switches: the header's comment lines up to the function
# (values 0 and 1, or the two a "(N a or b)" after it names)
docs=$(sed -n '1,/^cfg_env() {/p' "$script" | grep '^#' | tr '\n' ' ' |
    grep -oE '\b[a-z][a-z0-9]*N DS4_[A-Z0-9_]+=N( \(N [0-9] or [0-9]\))?' | sort -u)
n=0
while read -r name var rest; do
    [ -n "$name" ] || continue
    name=${name%N}; var=${var%=N}
    vals="0 1"
    case $rest in "(N "*) vals=$(echo "$rest" | tr -dc '0-9 ' | awk '{print $1, $2}') ;; esac
    n=$((n + 1))
    for v in $vals; do
        got=$(cfg_env "$name$v")
        case " $got " in
        *" $var=$v "*) ;;
        *) bad "switch $name$v" "cfg_env gives '$got', the header says $var=$v" ;;
        esac
    done
done <<< "$docs"
[ "$n" -ge 40 ] && ok "$n documented switches set their variables" || bad "documented switches" "only $n found"
case " $(cfg_env new) $(cfg_env default) " in
*DS4_*) bad "new/default" "name a variable" ;;
*) ok "new and default are the defaults" ;;
esac
out=$(OUT="$tmp/o" PKG=/nonexistent FULL_CFGS="warm+narrow1 warm+narow1" bash "$script" full 2>&1); rc=$?
if [ $rc -eq 2 ] && printf '%s' "$out" | grep -q "unknown switch: narow1" && [ ! -e "$tmp/o/summary.txt" ] && [ ! -e "$tmp/o/gpu.txt" ]; then
    ok "an unknown switch is refused before any step"
else
    bad "unknown switch" "rc $rc, output '$out'"
fi
out=$(OUT="$tmp/o2" PKG=/nonexistent TEST_CFGS="r161+comb41+cearly1 narrow0" SAME_CFGS="new" bash "$script" none 2>&1); rc=$?
if [ $rc -eq 0 ]; then ok "known switches pass"; else bad "known switches" "rc $rc, output '$out'"; fi
# OUT_ONE=1: a run's CSV files go into logs.tgz beside the summary
for one in 0 1; do
    mkdir -p "$tmp/p$one/sub" && echo "a,b" > "$tmp/p$one/x.csv" && echo log > "$tmp/p$one/sub/r.log"
    OUT_ONE=$one OUT="$tmp/p$one" PKG=/nonexistent bash "$script" none > /dev/null 2>&1
    left=$(cd "$tmp/p$one" && ls | tr '\n' ' ')
    packed=$(tar tzf "$tmp/p$one/logs.tgz" 2>/dev/null | grep -c -E 'x\.csv|r\.log')
    want="logs.tgz summary.txt x.csv "; [ $one = 1 ] && want="logs.tgz summary.txt "
    if [ "$left" = "$want" ] && [ "$packed" = $((1 + one)) ]; then
        ok "OUT_ONE=$one leaves $want"
    else
        bad "OUT_ONE=$one" "left '$left', $packed of the two files packed"
    fi
done
h2_result
