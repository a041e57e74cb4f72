#!/usr/bin/env bash
# cuda_device_suite.sh - on a GPU machine without the project's Debian -dev
# packages: build the library and the CUDA + model tests with the project
# Makefile, taking the missing headers and shared libraries from DEVLIBS
# (include/ and lib/, copied from a Debian machine), then run them. The
# session tests pick the CUDA backend by default when a GPU is present, so
# test_model_golden is the whole-model parity check on the GPU.
#
#   DEVLIBS=devlibs bench/cuda_device_suite.sh [OUTDIR]
set -u
D=$(cd "${DEVLIBS:-devlibs}" && pwd)
out=${1:-build-gpu}
mkdir -p "$out" build/tests   # test_model_golden writes its GGUFs to build/tests
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
LIBS="-lm -lpthread -L$D/lib -Wl,-rpath,$D/lib -ljansson -lcrypto -lpcre2-8 -lutf8proc -lzstd"
LIBS="$LIBS -L$CUDA_HOME/lib64 -Wl,-rpath,$CUDA_HOME/lib64 -lcudart -lcublas -lstdc++"
tests="test_cuda_decode test_cuda_kernels test_cuda_ops test_cuda_session test_ops test_model_golden ${EXTRA_TESTS:-}"
targets=""
for t in $tests; do targets="$targets build-gpu/tests/$t"; done
targets="$targets ${PROGRAMS:-}"   # e.g. PROGRAMS="ds4-quantize ds4-gpubench"
make -j"$(nproc)" BUILD=build-gpu EXTRA_CFLAGS="-I$D/include" LDLIBS="$LIBS" $targets > "$out/suite_build.log" 2>&1 ||
    { tail -40 "$out/suite_build.log"; exit 1; }
bins=""
for t in $tests; do bins="$bins build-gpu/tests/$t"; done
tests/run_tests.sh $bins 2>&1 | tee "$out/suite_tests.log"
# Second pass over the GPU-side tests with the rewritten small kernels
# (DS4_CUDA_SMALL_V2=1, docs/CUDA.md): they must pass too before that
# switch can become the default.
v2=""
for t in test_cuda_ops test_model_golden test_cuda_session; do v2="$v2 build-gpu/tests/$t"; done
DS4_CUDA_SMALL_V2=1 tests/run_tests.sh $v2 2>&1 | tee "$out/suite_tests_small_v2.log"
