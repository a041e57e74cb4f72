#!/usr/bin/env bash
# h200_pack.sh - build the GPU-side programs and tests here (sm_90) and pack
# them, stripped of debug info, with the shared libraries they link beyond
# glibc and the CUDA toolkit, into .devwork/pkg.tar.xz: small enough to
# travel with the working tree to a GPU machine that lacks the project's
# Debian -dev packages. bench/h200_run.sh runs them there:
#
#   bench/h200_pack.sh            # here
#   tar xJf .devwork/pkg.tar.xz && PKG=.devwork/pkg OUT=$OUT bench/h200_run.sh   # there
#
# PACK_TESTS="t1 t2 ...": only those test binaries.
# BASE=1: the programs only, no test binaries (~4 MB instead of ~5.3), for
# the base build of bench/h200_ab.sh: the device call carries the tracked
# tree (~54 MiB) and both packages within its 64 MiB.
# SERVER=1: ds4-server, ds4, ds4-bench and ds4-quantize with their
# libraries (the server's TLS stack is ~4 MB packed), no test binaries, as
# .devwork/pkg-srv.tar.xz (~9.1 MB), for h200_run.sh's `server`, `full`
# and `same` steps (PKG=.devwork/pkg-srv): beside the tracked tree (~54
# MiB) there is no room for both packages.
# LINEINFO=0: device code without line tables (-lineinfo, the Makefile's
# default for ncu's source view, makes a cubin ~3x larger; the SASS is the
# same), built apart in .devwork/bn-nl: the package shrinks enough that a
# base build (BASE=1) travels beside it in one device call.
set -euo pipefail
B=.devwork/bn
nvflags=()
if [ "${LINEINFO:-1}" = 0 ]; then
    B=.devwork/bn-nl
    nvflags=("NVCCFLAGS=-O3 -std=c++17 -I. -gencode=arch=compute_${CUDA_ARCHS:-90},code=sm_${CUDA_ARCHS:-90} -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings")
fi
name=pkg
[ "${SERVER:-0}" = 1 ] && name=pkg-srv
P=.devwork/$name
mkdir -p .devwork # ignored by git: a fresh clone has none
tests="test_cuda_decode test_cuda_kernels test_cuda_ops test_cuda_session test_cuda_moe test_ops test_model_golden
       test_decode_batch test_weight_share test_bench_model test_cuda_expert_cache test_expert_slots"
# PACK_TESTS="test_cuda_ops ...": only those test binaries (the call's files
# have a 64 MiB limit with the tracked tree: ~58 MB of it, the full package
# ~8.6 MB)
[ -n "${PACK_TESTS:-}" ] && tests=$PACK_TESTS
progs="ds4 ds4-bench ds4-gpubench ds4-quantize"
if [ "${BASE:-0}" = 1 ]; then tests=""; progs="ds4 ds4-bench ds4-gpubench"; fi
if [ "${SERVER:-0}" = 1 ]; then tests=""; progs="ds4 ds4-bench ds4-quantize ds4-server"; fi
targets=""
for t in $tests; do targets="$targets $B/tests/$t"; done
for p in $progs; do targets="$targets $B/bin/$p"; done
make -j"$(nproc)" CUDA_ARCHS="${CUDA_ARCHS:-90}" "${nvflags[@]}" BUILD=$B BINDIR=$B/bin EXTRA_LDFLAGS="-Wl,--as-needed" $targets \
    > .devwork/pack-make.log 2>&1 || { tail -30 .devwork/pack-make.log; echo "h200_pack: build failed" >&2; exit 1; }
rm -rf $P && mkdir -p $P/bin $P/tests $P/lib
for t in $tests; do strip --strip-debug -o $P/tests/$t $B/tests/$t; done
for p in $progs; do strip --strip-debug -o $P/bin/$p $B/bin/$p; done
ldd $P/bin/* $(find $P/tests -type f) | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so|cuda' |
    while read -r l; do cp -L "$l" $P/lib/; done
# token ids for the CPU-vs-CUDA logits check: BOS + the start of the benchmark text
if [ -x $P/bin/ds4 ]; then
    head -c 6000 tests/data/bench/promessi_sposi.txt > $P/text.txt
    $B/bin/ds4 -m tests/data/tokenizer/dsv4-vocab.gguf --dump-tokens --prompt-file $P/text.txt > $P/tokens.tsv
    (echo 0; awk -F'\t' 'NR <= 511 {print $1}' $P/tokens.tsv) | tr '\n' ' ' > $P/ids512.txt  # awk, not head: head's early exit failed the pipe (pipefail)
fi
git rev-parse HEAD > $P/commit.txt
git status --porcelain --untracked-files=no | head -50 > $P/dirty.txt
XZ_OPT=-9 tar cJf .devwork/$name.tar.xz -C .devwork $name
ls -la .devwork/$name.tar.xz
