#!/usr/bin/env bash
# build_peers.sh - builds the peers of bench/vs_llamacpp.sh outside the
# repository: mainline llama.cpp and ik_llama.cpp at pinned commits with
# DeepSeek V4 support, CPU only, and links their tools into DIR/bin under
# the names vs_llamacpp.sh looks for on the PATH:
#
#   bench/build_peers.sh DIR [mainline] [ik]      (both when none is named)
#   PATH=DIR/bin:$PATH bench/vs_llamacpp.sh MODEL.gguf
#
# DIR/bin then holds llama-bench and llama-perplexity (mainline),
# ik-llama-bench and ik-llama-perplexity (ik_llama.cpp).
#
# Environment:
#   LLAMA_SRC, IK_SRC   where to clone from: a URL or a local git directory
#                       (default: the projects' GitHub repositories)
#   LLAMA_COMMIT, IK_COMMIT   the pinned commits (below)
#   JOBS                parallel compile jobs (default: the online CPUs)
#
# The commits are the ones docs/BENCHMARKS.md's side-by-side tables were
# measured with. The flags: Release, native CPU code, no CUDA, static
# libraries, and for ik_llama.cpp GGML_IQK_FA_ALL_QUANTS=OFF, which
# instantiates its flash-attention kernels for the common KV types only
# (with all of them single files took over 30 minutes on 2 cores; with the
# option the whole build took 20-40 minutes there). An existing checkout in DIR is
# reused (fetched to the pinned commit and built incrementally).
set -eu
DIR=${1:?usage: bench/build_peers.sh DIR [mainline] [ik]}
shift
want=${*:-mainline ik}
LLAMA_SRC=${LLAMA_SRC:-https://github.com/ggml-org/llama.cpp}
IK_SRC=${IK_SRC:-https://github.com/ikawrakow/ik_llama.cpp}
LLAMA_COMMIT=${LLAMA_COMMIT:-3f545beccee69d9975f466ec7e45fd9aacd8ba90}
IK_COMMIT=${IK_COMMIT:-8337e4cd3861406fc04e0854b1409cd1b027fbc9}
JOBS=${JOBS:-$(nproc)}
command -v cmake > /dev/null || { echo "build_peers: cmake is needed (apt-get install cmake)" >&2; exit 2; }
command -v git > /dev/null || { echo "build_peers: git is needed" >&2; exit 2; }
mkdir -p "$DIR/bin"
DIR=$(cd "$DIR" && pwd)

# $1 name (the checkout's folder), $2 source, $3 commit, $4 prefix of the
# linked tool names, then extra cmake options
build() {
    local name=$1 src=$2 commit=$3 prefix=$4
    shift 4
    local co="$DIR/$name"
    if [ ! -d "$co/.git" ]; then
        echo "build_peers: cloning $src into $co" >&2
        git clone -q "$src" "$co"
    fi
    if ! git -C "$co" cat-file -e "$commit^{commit}" 2> /dev/null; then
        git -C "$co" fetch -q origin "$commit" || git -C "$co" fetch -q origin
    fi
    [ "$(git -C "$co" rev-parse HEAD 2> /dev/null)" = "$commit" ] ||
        git -C "$co" -c advice.detachedHead=false checkout -q "$commit" || {
        echo "build_peers: $name: commit $commit is not in $src" >&2
        return 1
    }
    cmake -S "$co" -B "$co/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=OFF "$@" > "$co/build-cmake.log" 2>&1 || {
        echo "build_peers: $name: cmake failed, see $co/build-cmake.log" >&2
        return 1
    }
    echo "build_peers: building $name $(git -C "$co" log -1 --format='%h (%cd)' --date=short) with $JOBS jobs" >&2
    cmake --build "$co/build" -j "$JOBS" --target llama-bench llama-perplexity > "$co/build.log" 2>&1 || {
        echo "build_peers: $name: the build failed, see $co/build.log" >&2
        return 1
    }
    for tool in llama-bench llama-perplexity; do
        ln -sf "$co/build/bin/$tool" "$DIR/bin/$prefix$tool"
    done
    echo "build_peers: $name: $DIR/bin/${prefix}llama-bench, $DIR/bin/${prefix}llama-perplexity" >&2
}

rc=0
for w in $want; do
    case $w in
    mainline) build llama.cpp "$LLAMA_SRC" "$LLAMA_COMMIT" "" || rc=1 ;;
    ik) build ik_llama.cpp "$IK_SRC" "$IK_COMMIT" ik- -DGGML_IQK_FA_ALL_QUANTS=OFF || rc=1 ;;
    *) echo "build_peers: unknown peer '$w' (mainline, ik)" >&2; rc=2 ;;
    esac
done
exit $rc
