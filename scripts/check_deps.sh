#!/usr/bin/env bash
# check_deps.sh - the build's dependencies, checked before anything is
# compiled (the Makefile runs it once per build directory). For each header
# the sources include (and the compiler itself) the Debian/Ubuntu package
# that provides it; whatever is missing is installed with apt-get (through
# sudo when not root), or the build stops with one line naming the exact
# packages. DS4_NO_INSTALL=1 only checks and names them.
#
# usage: check_deps.sh CC     (exit 0: all present)
set -u
cc="${1:-cc}"
# header  package   (one a line; the compiler is checked separately)
deps="jansson.h libjansson-dev
microhttpd.h libmicrohttpd-dev
openssl/evp.h libssl-dev
editline/readline.h libedit-dev
pcre2.h libpcre2-dev
utf8proc.h libutf8proc-dev"

missing=""
add() { case " $missing " in *" $1 "*) ;; *) missing="${missing:+$missing }$1" ;; esac; }
ccbin="${cc%% *}"
if ! command -v "$ccbin" >/dev/null 2>&1; then
    case "$(basename "$ccbin")" in clang*) add clang ;; *) add build-essential ;; esac
    # without a compiler no header can be checked: name them all
    while read -r h p; do add "$p"; done <<< "$deps"
    add libopenmpi-dev; add openmpi-bin
else
    while read -r h p; do
        # pcre2.h wants its code unit width chosen first
        printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <%s>\n' "$h" |
            $cc -E -x c - >/dev/null 2>&1 || add "$p"
    done <<< "$deps"
    # Open MPI (distributed runs): mpi.h lives in its own include directory
    mpi_flags=$(pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile 2>/dev/null)
    printf '#include <mpi.h>\n' | $cc $mpi_flags -E -x c - >/dev/null 2>&1 || add libopenmpi-dev
    command -v mpirun >/dev/null 2>&1 || add openmpi-bin
fi
[ -z "$missing" ] && exit 0

sudo=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else sudo="none"; fi
fi
if [ "${DS4_NO_INSTALL:-0}" = 1 ] || ! command -v apt-get >/dev/null 2>&1 || [ "$sudo" = none ]; then
    echo "missing build dependencies: install them with: apt-get install $missing" >&2
    exit 1
fi
echo "build dependencies missing: $missing; installing them (${sudo:+$sudo }apt-get install)" >&2
export DEBIAN_FRONTEND=noninteractive
if ! { $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends $missing; } >&2; then
    echo "missing build dependencies: install them with: apt-get install $missing" >&2
    exit 1
fi
