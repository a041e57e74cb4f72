#!/usr/bin/env bash
# test_ncu_summary.sh - scripts/ncu_summary.py on a log in ncu's --csv
# layout (one row a launch and metric): the time table over the last N
# launches (the kncu step's --tail), and --metric's per-kernel sum and mean
# of another metric over the same launches (bench/h200_run.sh kncu with
# KN_METRICS). The expected numbers are worked out by hand from the rows
# below. No GPU needed. Prints "RESULT passed failed skipped".
set -u
cd "$(dirname "$0")/.."
. tests/counters_lib.sh
h='"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'
row() { # id kernel metric unit value
    printf '"%s","1","ds4-bench","h","%s","1","14","(768, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","%s","%s","%s"\n' "$@"
}
{
    echo '==PROF== Connected to process 1'
    echo "$h"
    row 0 'void ds4_gb_kernel<24, 2, 2>(ds4_gb_args)' gpu__time_duration.sum usecond 999.00
    row 0 'void ds4_gb_kernel<24, 2, 2>(ds4_gb_args)' smsp__inst_executed.sum inst 1,000
    row 1 'void ds4_gb_kernel<24, 2, 2>(ds4_gb_args)' gpu__time_duration.sum usecond 180.00
    row 1 'void ds4_gb_kernel<24, 2, 2>(ds4_gb_args)' smsp__inst_executed.sum inst 100,000,000
    row 2 'ds4_gd_regs_kernel(ds4_gd_args)' gpu__time_duration.sum nsecond 96,000.00
    row 2 'ds4_gd_regs_kernel(ds4_gd_args)' smsp__inst_executed.sum inst 40,000,000
    row 3 'void ds4_gb_kernel<24, 2, 2>(ds4_gb_args)' gpu__time_duration.sum usecond 184.00
    row 3 'void ds4_gb_kernel<24, 2, 2>(ds4_gb_args)' smsp__inst_executed.sum inst 102,000,000
} > "$tmp/k.csv"
out=$(python3 scripts/ncu_summary.py "$tmp/k.csv" --tail 3 --metric smsp__inst_executed.sum 2>&1); rc=$?
# the last 3 launches: gb 180 + 184 us (2 calls, 182 a call), gd 96 us; 460 us in all
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q '^3 launches, 460.0 us of GPU time' &&
    printf '%s\n' "$out" | grep -qE '^ds4_gb_kernel<24, 2, 2> +2 +182\.00 +364\.0 +79\.1%' &&
    printf '%s\n' "$out" | grep -qE '^ds4_gd_regs_kernel +1 +96\.00 +96\.0 +20\.9%'; then
    ok "the time table of the last 3 launches"
else
    bad "time table: rc $rc, '$out'"
fi
# instructions over the same launches: gb 202,000,000 (101,000,000 a launch), gd 40,000,000
if printf '%s\n' "$out" | grep -qE '^  ds4_gb_kernel<24, 2, 2> +2\.02e\+08 +1\.01e\+08$' &&
    printf '%s\n' "$out" | grep -qE '^  ds4_gd_regs_kernel +4e\+07 +4e\+07$'; then
    ok "--metric sums and averages per kernel over the same launches"
else
    bad "--metric: '$out'"
fi
out=$(python3 scripts/ncu_summary.py "$tmp/k.csv" --metric sm__throughput.avg.pct_of_peak_sustained_elapsed 2>&1); rc=$?
if [ $rc -ne 0 ] && printf '%s' "$out" | grep -q 'sm__throughput.avg.pct_of_peak_sustained_elapsed beside each launch'; then
    ok "a metric the log lacks is refused, named"
else
    bad "missing metric: rc $rc, '$out'"
fi
echo "RESULT $pass $fail $skip"
[ "$fail" = 0 ]
