#!/usr/bin/env bash
# mtp_steer_pack.sh - build, here, what bench/mtp_steer_gpu.sh runs on the
# GPU machine (sm_90 by default) and pack it into .devwork/mtp18pkg: ds4,
# ds4-bench and tests/test_cuda_mtp_steer, stripped, with the shared
# libraries they link beyond glibc and the CUDA toolkit (the GPU machine
# lacks the project's Debian -dev packages). Carry .devwork/mtp18pkg with
# the working tree, then there:
#
#   PKG=.devwork/mtp18pkg OUT=$OUT bash bench/mtp_steer_gpu.sh
set -euo pipefail
B=.devwork/bn18
P=.devwork/mtp18pkg
mkdir -p .devwork
make -j"${JOBS:-2}" CUDA_ARCHS="${CUDA_ARCHS:-90}" BUILD=$B BINDIR=$B/bin EXTRA_LDFLAGS="-Wl,--as-needed" \
    $B/bin/ds4 $B/bin/ds4-bench $B/tests/test_cuda_mtp_steer > .devwork/mtp18-make.log 2>&1 \
    || { tail -30 .devwork/mtp18-make.log; echo "mtp_steer_pack: build failed" >&2; exit 1; }
rm -rf $P && mkdir -p $P/bin $P/tests $P/lib
strip --strip-debug -o $P/bin/ds4 $B/bin/ds4
strip --strip-debug -o $P/bin/ds4-bench $B/bin/ds4-bench
strip --strip-debug -o $P/tests/test_cuda_mtp_steer $B/tests/test_cuda_mtp_steer
ldd $P/bin/* $P/tests/* | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|cuda' |
    while read -r l; do cp -L "$l" $P/lib/; done
git rev-parse HEAD > $P/commit.txt
git status --porcelain --untracked-files=no | head -50 > $P/dirty.txt
du -sh $P
