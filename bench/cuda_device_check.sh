#!/usr/bin/env bash
# cuda_device_check.sh - build and run only the CUDA backend's tests and
# benchmark, for a GPU machine that lacks the Debian libraries the rest of
# the project links (jansson, microhttpd, utf8proc, ...): the CUDA files,
# util/error.c and the test harness need none of them.
#
#   bench/cuda_device_check.sh [OUTDIR]     (from the repository root)
#
# Builds into build-cuda/, runs tests/test_cuda_*.c, then ds4-gpubench;
# logs go to OUTDIR (default build-cuda/) as well as to stdout.
set -u
out=${1:-build-cuda}
B=build-cuda
mkdir -p "$B" "$out"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
ARCH=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')}
ARCH=${ARCH:-90}
CC=${CC:-cc}
CFLAGS="-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -I. -pthread -DDS4_HAVE_CUDA=1"
set -e
objs=""
for f in backend/cuda/*.cu; do
    o="$B/$(basename "$f" .cu).cu.o"
    "$NVCC" -O3 -std=c++17 -g -lineinfo -I. -gencode=arch=compute_$ARCH,code=sm_$ARCH \
        -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings -c "$f" -o "$o" &
    objs="$objs $o"
done
$CC $CFLAGS -c util/error.c -o $B/error.o
$CC $CFLAGS -c tests/harness.c -o $B/harness.o
wait
LIBS="-L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcudart -lcublas -lstdc++ -lm -lpthread"
for t in tests/test_cuda_*.c; do
    n=$(basename "$t" .c)
    $CC $CFLAGS "$t" $B/harness.o $B/error.o $objs $LIBS -o "$B/$n"
done
$CC $CFLAGS bench/ds4_gpubench_main.c $B/error.o $objs $LIBS -o "$B/ds4-gpubench"
set +e
tests/run_tests.sh $B/test_cuda_* 2>&1 | tee "$out/cuda_tests.log"
"$B/ds4-gpubench" "${@:2}" 2>&1 | tee "$out/cuda_bench.log"
