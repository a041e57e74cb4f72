#!/usr/bin/env bash
# stream_bench.sh - expert streaming against plain mmap on a model larger
# than the cache (docs/STREAMING.md, docs/BENCHMARKS.md):
#
#   bench/stream_bench.sh MODEL.gguf "4GB 8GB 16GB" [OUTDIR]
#
# For each budget, then without streaming: the model file is dropped from
# the page cache (posix_fadvise on that file only), then ds4-bench prefills
# 128 tokens of promessi_sposi.txt (one chunk) and decodes 8, on the CPU.
# With --ssd-streaming ds4-bench also measures the disk's read bandwidth
# (same run) and logs hit rates, bytes read per token and peak RSS; the
# mmap run gets its peak RSS from /usr/bin/time. A budget is skipped when
# MemAvailable cannot hold it plus 4 GiB (the machine may be shared).
set -u
M=$1; BUDGETS=$2; OUT=${3:-/tmp/stream-bench}
mkdir -p "$OUT"
common=(--prompt-file tests/data/bench/promessi_sposi.txt --cpu --ctx-start 128 --ctx-max 128 --gen-tokens 8)
drop() { python3 -c "import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)" "$M"; }
avail_gib() { awk '/MemAvailable/ { printf "%d", $2 / 1048576 }' /proc/meminfo; }
for b in $BUDGETS; do
    need=${b%GB}; need=${need%.*}
    if [ "$(avail_gib)" -lt $((need + 4)) ]; then echo "skip $b: only $(avail_gib) GiB available"; continue; fi
    drop
    /usr/bin/time -v ./ds4-bench -m "$M" "${common[@]}" --ssd-streaming --ssd-streaming-cold \
        --ssd-streaming-cache-experts "$b" > "$OUT/stream-$b.csv" 2> "$OUT/stream-$b.log"
    echo "== $b"; grep -E "^[0-9]|disk read|expert cache|peak RSS|Maximum resident|load average" "$OUT/stream-$b.log" "$OUT/stream-$b.csv"
done
drop
/usr/bin/time -v ./ds4-bench -m "$M" "${common[@]}" > "$OUT/mmap.csv" 2> "$OUT/mmap.log"
echo "== mmap"; grep -E "^[0-9]|peak RSS|Maximum resident|load average|Major" "$OUT/mmap.log" "$OUT/mmap.csv"
