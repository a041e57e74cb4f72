# DwarfStar build.
#
#   make            every binary into the repo root, plus libds4.a
#   make test       build and run the whole test suite ("N passed, N failed")
#   make asan       the suite under AddressSanitizer + UBSan (build-asan/)
#   make fuzz       the libFuzzer targets with clang (build-fuzz/)
#   make bench      CPU kernel bandwidth table (ds4-bench --kernels)
#
# Sources are found by directory, so adding a file needs no edit here:
#   library      util/ gguf/ quant/ text/ model/ backend/ backend/cpu/ engine/
#   CUDA         backend/cuda/*.cu (with CUDA=1, CUDA_ARCHS=.. or a visible GPU;
#                NO_CUDA=1 skips)
#   programs     <dir>/<name>_main.c in cli/ tools/ server/ agent/ bench/
#                becomes ./<name with _ as -> (ds4_gguf_main.c -> ds4-gguf),
#                linked with the other .c files of the front-end dirs
#   tests        tests/test_*.c (one binary each) and tests/test_*.sh
#   fuzzers      fuzz/fuzz_*.c
# Files named *_avx2.c / *_avx512.c get the matching -m flags; the code
# picks among them at run time (backend/cpu dispatch), so the binaries run
# on any x86-64.

BUILD   ?= build
BINDIR  ?= .
CC      ?= cc
ifeq ($(origin CC),default)
CC := cc
endif
OPT     ?= -O2
CFLAGS_COMMON = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra -Werror -I. -pthread
DEPFLAGS = -MMD -MP
LDLIBS  = -lm -lpthread -ljansson -lmicrohttpd -lcrypto -ledit -lpcre2-8 -lutf8proc
# Open MPI (Debian libopenmpi-dev) for distributed runs (docs/DISTRIBUTED.md):
# only engine/dist_mpi.c includes mpi.h; every binary links libmpi.
MPI_CFLAGS ?= $(shell pkg-config --cflags ompi-c 2>/dev/null || mpicc --showme:compile 2>/dev/null)
MPI_LIBS   ?= $(shell pkg-config --libs ompi-c 2>/dev/null || mpicc --showme:link 2>/dev/null || echo -lmpi)
LDLIBS += $(MPI_LIBS)
AVX2_FLAGS   = -mavx2 -mfma -mf16c
AVX512_FLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni

LIB_DIRS   = util gguf quant text model backend backend/cpu engine
FRONT_DIRS = cli tools server agent bench

LIB_SRCS   = $(foreach d,$(LIB_DIRS),$(wildcard $(d)/*.c))
FRONT_ALL  = $(foreach d,$(FRONT_DIRS),$(wildcard $(d)/*.c))
MAIN_SRCS  = $(filter %_main.c,$(FRONT_ALL))
FRONT_SRCS = $(filter-out %_main.c,$(FRONT_ALL))
TEST_SRCS  = $(wildcard tests/test_*.c)
TEST_LIB_SRCS = tests/harness.c
TEST_SCRIPTS  = $(wildcard tests/test_*.sh)
FUZZ_SRCS  = $(wildcard fuzz/fuzz_*.c)
CUDA_SRCS  = $(wildcard backend/cuda/*.cu)

# ---- CUDA (optional) -------------------------------------------------------
# The CUDA backend is built when asked for (CUDA=1, or CUDA_ARCHS given) or
# when a GPU is visible (nvidia-smi); NO_CUDA=1 always skips it. So the
# first build on a machine without a GPU is quick; CI asks with CUDA=1.
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(shell command -v nvcc 2>/dev/null || (test -x $(CUDA_HOME)/bin/nvcc && echo $(CUDA_HOME)/bin/nvcc))
# Default: Ampere..Hopper plus the local GPU when one is visible.
CUDA_ARCH ?= $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.' | grep -E '^[0-9]+$$' || true)
WANT_CUDA := $(if $(filter 1,$(CUDA)),1,$(if $(filter command line environment,$(origin CUDA_ARCHS)),1,$(if $(CUDA_ARCH),1,)))
CUDA_ARCHS ?= $(if $(CUDA_ARCH),$(CUDA_ARCH),80 86 89 90)
NVCC_GENCODE = $(foreach a,$(CUDA_ARCHS),-gencode=arch=compute_$(a),code=sm_$(a))
NVCCFLAGS ?= -O3 -std=c++17 -g -lineinfo -I. $(NVCC_GENCODE) \
             -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings
ifneq ($(NO_CUDA),1)
ifeq ($(WANT_CUDA),1)
ifeq ($(strip $(NVCC)),)
$(error CUDA build asked for (CUDA=1, CUDA_ARCHS or a visible GPU) but nvcc was not found: install the CUDA toolkit, set CUDA_HOME, or pass NO_CUDA=1)
endif
ifneq ($(strip $(CUDA_SRCS)),)
HAVE_CUDA := 1
endif
endif
endif
ifeq ($(HAVE_CUDA),1)
CFLAGS_COMMON += -DDS4_HAVE_CUDA=1
CUDA_OBJS = $(patsubst %.cu,$(BUILD)/%.cu.o,$(CUDA_SRCS))
LDLIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
endif

# Default expert hot lists (docs/STREAMING.md): data files compiled in
# (rule below, after `all`).
CFLAGS_COMMON += -I$(BUILD)/gen

CFLAGS = $(CFLAGS_COMMON) $(EXTRA_CFLAGS)

.DEFAULT_GOAL := all

# --version: the commit of the tree being built. Only util/version.o
# depends on it, through a stamp rewritten when the commit changes.
DS4_COMMIT := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
$(shell mkdir -p $(BUILD) && (echo '$(DS4_COMMIT)' | cmp -s - $(BUILD)/commit.stamp || echo '$(DS4_COMMIT)' > $(BUILD)/commit.stamp))
$(BUILD)/util/version.o: $(BUILD)/commit.stamp
$(BUILD)/util/version.o: CFLAGS += -DDS4_COMMIT='"$(DS4_COMMIT)"'
# The build's configuration, in a stamp every object depends on: a build
# folder compiled under another one (CUDA on or off, other flags or
# compilers) is rebuilt, not linked with the new objects (a tree built
# with a GPU visible, then with NO_CUDA=1, failed to link: its C objects
# still called ds4_cuda_*). Written only when it changes ($(file), so no
# flag is quoted through a shell).
BUILD_CONFIG := cc=$(CC) cflags=$(CFLAGS) mpi=$(MPI_CFLAGS) cuda=$(HAVE_CUDA)$(if $(HAVE_CUDA), nvcc=$(NVCC) $(NVCCFLAGS))
ifneq ($(BUILD_CONFIG),$(file <$(BUILD)/config.stamp))
$(file >$(BUILD)/config.stamp,$(BUILD_CONFIG))
endif
LDFLAGS += $(EXTRA_LDFLAGS) -pthread

LIB_OBJS   = $(patsubst %.c,$(BUILD)/%.o,$(LIB_SRCS)) $(CUDA_OBJS)
FRONT_OBJS = $(patsubst %.c,$(BUILD)/%.o,$(FRONT_SRCS))
TEST_LIB_OBJS = $(patsubst %.c,$(BUILD)/%.o,$(TEST_LIB_SRCS))
LIBDS4     = $(BUILD)/libds4.a
LIBFRONT   = $(BUILD)/libfront.a
bin_name   = $(subst _,-,$(patsubst %_main,%,$(basename $(notdir $(1)))))
BINS       = $(foreach m,$(MAIN_SRCS),$(BINDIR)/$(call bin_name,$(m)))
TEST_BINS  = $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))

.PHONY: all test check-nocuda asan fuzz fuzzers bench clean
.SECONDARY:
all: $(BINS) libds4.a

HOTLISTS = $(sort $(wildcard models/hotlists/*.hotlist))
$(BUILD)/gen/expert_hotlists.inc: $(HOTLISTS) scripts/hotlists_to_c.sh
	@mkdir -p $(@D)
	sh scripts/hotlists_to_c.sh $(HOTLISTS) > $@.tmp && mv $@.tmp $@
$(BUILD)/engine/expert_hotlist_default.o: $(BUILD)/gen/expert_hotlists.inc

libds4.a: $(LIBDS4)
	cp $< $@

$(LIBDS4): $(LIB_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

$(LIBFRONT): $(FRONT_OBJS)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $(FRONT_OBJS)

# Build dependencies first: scripts/check_deps.sh installs what is missing
# (apt-get, sudo when not root) or stops naming the packages. Once per
# build directory and compiler.
$(BUILD)/.deps-ok: scripts/check_deps.sh
	@mkdir -p $(@D)
	@scripts/check_deps.sh "$(CC)"
	@touch $@

$(BUILD)/%.o: %.c $(BUILD)/config.stamp | $(BUILD)/.deps-ok
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(SIMD_FLAGS) $(DEPFLAGS) -c $< -o $@

$(BUILD)/engine/dist_mpi.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/%_avx2.o: SIMD_FLAGS = $(AVX2_FLAGS)
$(BUILD)/%_avx512.o: SIMD_FLAGS = $(AVX512_FLAGS)

$(BUILD)/%.cu.o: %.cu $(BUILD)/config.stamp
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

define BIN_RULE
$(BINDIR)/$(call bin_name,$(1)): $(patsubst %.c,$(BUILD)/%.o,$(1)) $(LIBFRONT) $(LIBDS4)
	@mkdir -p $$(@D)
	$$(CC) $$(LDFLAGS) -Wl,-u,ds4_version_string -o $$@ $$^ $$(LDLIBS)
endef
$(foreach m,$(MAIN_SRCS),$(eval $(call BIN_RULE,$(m))))

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(TEST_LIB_OBJS) $(LIBFRONT) $(LIBDS4)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# The C files that read DS4_HAVE_CUDA, compiled once more without it (syntax
# only, seconds): a CUDA build's `make test` then also holds the build a
# machine without nvcc makes (a GPU test outside its #if once compiled only
# with CUDA).
NOCUDA_SRCS = $(shell grep -l DS4_HAVE_CUDA $(sort $(wildcard tests/*.c engine/*.c util/*.c bench/*.c cli/*.c server/*.c)) 2>/dev/null)
check-nocuda: $(BUILD)/gen/expert_hotlists.inc
	@for f in $(NOCUDA_SRCS); do \
	    $(CC) -fsyntax-only $(filter-out -DDS4_HAVE_CUDA=1,$(CFLAGS)) $$f || { echo "check-nocuda: $$f"; exit 1; }; \
	done

test: check-nocuda $(TEST_BINS) $(BINS)
	DS4_BIN_DIR=$(BINDIR) tests/run_tests.sh $(TEST_BINS) $(TEST_SCRIPTS)

ASAN_FLAGS = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
asan:
	$(MAKE) BUILD=build-asan BINDIR=build-asan/bin NO_CUDA=1 OPT=-O1 \
	    EXTRA_CFLAGS="$(ASAN_FLAGS)" EXTRA_LDFLAGS="$(ASAN_FLAGS)" \
	    DS4_SLOW_TESTS=0 test

FUZZ_FLAGS = -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
fuzz:
	$(MAKE) CC=clang BUILD=build-fuzz BINDIR=build-fuzz/bin NO_CUDA=1 OPT=-O1 \
	    EXTRA_CFLAGS="$(FUZZ_FLAGS)" EXTRA_LDFLAGS="-fsanitize=address,undefined" fuzzers

FUZZ_BINS = $(patsubst fuzz/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))
fuzzers: $(FUZZ_BINS)
$(BUILD)/fuzz/%: $(BUILD)/fuzz/%.o $(LIBFRONT) $(LIBDS4)
	$(CC) -fsanitize=fuzzer $(LDFLAGS) -o $@ $^ $(LDLIBS)

bench: all
	$(BINDIR)/ds4-bench --kernels

clean:
	rm -rf build build-asan build-fuzz libds4.a $(BINS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
