#!/usr/bin/env bash
# tp_gpu_pack.sh - build here (sm_90) and pack the tensor-parallel checks for
# a GPU machine without the project's Debian -dev packages (as
# bench/h200_pack.sh does for the CUDA tests): test_cuda_comm (the NCCL
# communicator, one rank per GPU) and test_tensor_parallel (the sharded
# model on the CPU backend's in-process ranks). bench/tp_gpu_run.sh runs
# them there.
#
#   bench/tp_gpu_pack.sh                                        # here
#   tar xJf .devwork/tp-pkg.tar.xz -C .devwork && bench/tp_gpu_run.sh   # there ($OUT: logs)
set -euo pipefail
B=.devwork/bn19
P=.devwork/tp-pkg
tests="test_cuda_comm test_tensor_parallel"
targets=""
for t in $tests; do targets="$targets $B/tests/$t"; done
make -j"$(nproc)" CUDA_ARCHS="${CUDA_ARCHS:-90}" BUILD=$B BINDIR=$B/bin EXTRA_LDFLAGS="-Wl,--as-needed" $targets \
    > .devwork/tp-pack-make.log 2>&1 || { tail -30 .devwork/tp-pack-make.log; echo "tp_gpu_pack: build failed" >&2; exit 1; }
rm -rf $P && mkdir -p $P/tests $P/lib
for t in $tests; do strip --strip-debug -o $P/tests/$t $B/tests/$t; done
ldd $P/tests/* | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|cuda' |
    while read -r l; do cp -L "$l" $P/lib/; done
git rev-parse HEAD > $P/commit.txt
XZ_OPT=-9 tar cJf .devwork/tp-pkg.tar.xz -C .devwork tp-pkg
ls -la .devwork/tp-pkg.tar.xz
