#!/usr/bin/env bash
# test_steer_cli.sh - directional steering and --power through ds4 and
# ds4-steer on the demo model: a direction built from two prompt sets has
# the file format ds4 reads; scale 0 and --power leave the greedy answer
# unchanged; a large scale changes it; malformed files and flags are
# refused with the cause named.
set -u
D=${DS4_BIN_DIR:-.}
. tests/counters_lib.sh
M=models/ds4-demo.gguf
if [ ! -f $M ]; then echo "SKIP steer_cli: $M missing"; echo "RESULT 0 0 1"; exit 0; fi

printf 'Answer briefly.\nBe short.\n\nOne word please.\n' > "$tmp/t.txt"
printf 'Please explain in great detail.\nWrite a very long answer.\n' > "$tmp/c.txt"
"$D/ds4-steer" -m $M --target "$tmp/t.txt" --contrast "$tmp/c.txt" --out "$tmp/d.f32" -t 2 > "$tmp/log" 2>&1; rc=$?
# 6 layers x 64 dims x 4 bytes (models/README.md)
[ $rc -eq 0 ] && [ "$(stat -c %s "$tmp/d.f32")" = 1536 ] && grep -q "from 3 target and 2 contrast prompts" "$tmp/log" \
    && ok steer_build || bad "steer_build: rc $rc $(cat "$tmp/log")"
# every row is a unit vector (written by an independent reader)
python3 - "$tmp/d.f32" <<'PY' && ok steer_unit_rows || bad steer_unit_rows
import struct, sys, math
d = open(sys.argv[1], "rb").read()
v = struct.unpack("<%df" % (len(d) // 4), d)
for l in range(6):
    n = math.sqrt(sum(x * x for x in v[l * 64:(l + 1) * 64]))
    assert abs(n - 1) < 1e-5, (l, n)
PY

run() { "$D/ds4" -m $M -p "What is the capital of France?" --nothink --temp 0 -n 24 -t 2 "$@" 2>"$tmp/err"; }
base=$(run); s0=$(run --dir-steering-file "$tmp/d.f32" --dir-steering-ffn 0 --dir-steering-attn 0)
[ -n "$base" ] && [ "$base" = "$s0" ] && ok steer_scale0_same || bad "steer_scale0_same: '$base' vs '$s0'"
p=$(run --power 60)
[ "$base" = "$p" ] && ok power_same_output || bad "power_same_output: '$base' vs '$p'"
big=$(run --dir-steering-file "$tmp/d.f32" --dir-steering-ffn 8)
[ -n "$big" ] && [ "$base" != "$big" ] && ok steer_changes_output || bad "steer_changes_output: '$big'"

head -c 100 "$tmp/d.f32" > "$tmp/short.f32"
run --dir-steering-file "$tmp/short.f32" >/dev/null; rc=$?
[ $rc -ne 0 ] && grep -q "100 bytes, this model needs 1536" "$tmp/err" && ok steer_short_file || bad "steer_short_file: $(cat "$tmp/err")"
run --dir-steering-file "$tmp/missing.f32" >/dev/null; rc=$?
[ $rc -ne 0 ] && grep -q "missing.f32" "$tmp/err" && ok steer_missing_file || bad "steer_missing_file: $(cat "$tmp/err")"
run --dir-steering-ffn 1 >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "need --dir-steering-file" "$tmp/err" && ok steer_scale_without_file || bad steer_scale_without_file
run --dir-steering-file "$tmp/d.f32" --dir-steering-attn nan >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "finite number" "$tmp/err" && ok steer_nan_scale || bad steer_nan_scale
run --power 0 >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "1..100" "$tmp/err" && ok power_range || bad power_range
"$D/ds4-steer" -m $M --target "$tmp/empty" --contrast "$tmp/c.txt" --out "$tmp/x.f32" >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "cannot open" "$tmp/err" && [ ! -e "$tmp/x.f32" ] && ok steer_tool_missing_set || bad steer_tool_missing_set
# the server and the agent take the same flags and refuse the same file
timeout 60 "$D/ds4-server" -m $M --dir-steering-file "$tmp/short.f32" --port 1 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "100 bytes, this model needs 1536" "$tmp/err" && ok server_steer_short_file || bad "server_steer_short_file: $(cat "$tmp/err")"
timeout 60 "$D/ds4-server" -m $M --power 101 >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -eq 2 ] && grep -q "1..100" "$tmp/err" && ok server_power_range || bad server_power_range
timeout 60 "$D/ds4-agent" -m $M --dir-steering-file "$tmp/short.f32" -p hi --non-interactive >/dev/null 2>"$tmp/err"; rc=$?
[ $rc -ne 0 ] && grep -q "100 bytes, this model needs 1536" "$tmp/err" && ok agent_steer_short_file || bad "agent_steer_short_file: $(cat "$tmp/err")"
echo "RESULT $pass $fail 0"
