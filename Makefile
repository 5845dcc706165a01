# PXQ - one binary `pxq`, a static library of the engine, tests, fuzzers, and the CUDA backend
# when nvcc is present.  `make`, `make test`, `make test-cuda`, `make bench`, `make fuzz`, `make clean`.

CC      ?= cc
BUILD   ?= build
OPT     ?= -O2 -march=native
SAN     ?=
PKGS    := libpcre2-8 libcjson libutf8proc nettle
CFLAGS  += -std=c11 $(OPT) -g -Wall -Wextra -Wno-unused-parameter -D_GNU_SOURCE -pthread -Isrc \
           $(shell pkg-config --cflags $(PKGS) 2>/dev/null) $(SAN) -MMD -MP
LDLIBS  += $(shell pkg-config --libs $(PKGS) 2>/dev/null || echo -lpcre2-8 -lcjson -lutf8proc -lnettle) \
           -lmicrohttpd -lm -pthread

LIB_SRC := $(wildcard src/*.c) $(wildcard src/server/*.c)
CLI_SRC := $(wildcard src/cli/*.c)
TEST_SRC := $(wildcard tests/test_*.c)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/%.o)
TESTS   := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
# Micro-benchmarks (tests/bench_*.c): built with the tests, never run by `make test`.
BENCHES := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/bench_*.c))

# CUDA backend: built when nvcc is found (CUDA_ARCH=70 for a V100 build with a CUDA 12 toolchain).
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CU_SRC  := $(wildcard src/cuda/*.cu)
ifneq ($(NVCC),)
ifneq ($(CU_SRC),)
CUDA_ARCH ?= 75 80 86 89 90
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
NVFLAGS := -O3 -std=c++17 -Isrc -lineinfo --threads 0 $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
           $(if $(PROBE),-DPXQ_PROBE)
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
CFLAGS  += -DPXQ_CUDA -I$(CUDA_HOME)/include
$(BUILD)/src/cli/main.o: CFLAGS += -DPXQ_CUDA_ARCHS='"$(CUDA_ARCH)"'
LDLIBS  += -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++ -Wl,-rpath,$(CUDA_HOME)/lib64
endif
endif

all: $(BUILD)/pxq
	@[ "$(abspath $(BUILD))" != "$(abspath build)" ] || ln -sf build/pxq pxq 2>/dev/null || true
	@echo "built $(BUILD)/pxq$(if $(CU_OBJ), with the CUDA backend (sm_$(CUDA_ARCH)), (CPU only: no nvcc, or NVCC= given))"

# Every object rebuilds when the backend changes: CPU only, or CUDA with its CUDA_ARCH (CFLAGS
# then hold -DPXQ_CUDA, and pxq --version names the archs). Without this, `make NVCC=` after a CUDA
# build in the same BUILD kept the CUDA binary.
BACKEND := $(if $(CU_OBJ),cuda $(CUDA_ARCH),cpu)
$(BUILD)/backend: FORCE
	@mkdir -p $(BUILD); echo '$(BACKEND)' | cmp -s - $@ || echo '$(BACKEND)' > $@
$(LIB_OBJ) $(CLI_OBJ) $(CU_OBJ): $(BUILD)/backend
FORCE:

$(BUILD)/libpxq.a: $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/pxq: $(CLI_OBJ) $(BUILD)/libpxq.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(BUILD)/libpxq.a $(LDLIBS)

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/%.c $(BUILD)/libpxq.a tests/testutil.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -o $@ $< $(BUILD)/libpxq.a $(LDLIBS)

tests: $(TESTS) $(BENCHES) $(BUILD)/pxq

# The whole CPU suite: unit tests, model tests against the HF reference, the CLI and bad-input tests.
# `make test` alone builds with one job per core (a -j given on the command line wins) and
# run_tests.sh runs the suites in parallel, nproc at a time (PXQ_TEST_JOBS=N to change).
# (-j shows in MAKEFLAGS only inside recipes, hence the shell test.)
NPROC   := $(shell nproc 2>/dev/null || echo 2)
BUILD_TESTS = case " $$MAKEFLAGS " in *" -j"*) j= ;; *) j=-j$(NPROC) ;; esac; $(MAKE) --no-print-directory $$j tests
test:
	@$(BUILD_TESTS)
	@BUILD=$(BUILD) tests/run_tests.sh

# Bad-input tests (and the pxq.kv.* keys' refusals) under AddressSanitizer + UBSan, in their own build directory.
test-asan:
	$(MAKE) BUILD=build-asan OPT=-O1 SAN="-fsanitize=address,undefined -fno-omit-frame-pointer" tests
	BUILD=build-asan ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_bad_input
	ASAN_OPTIONS=detect_leaks=0 build-asan/tests/test_kv_calib

test-cuda:
	@$(BUILD_TESTS)
	@BUILD=$(BUILD) PXQ_TEST_CUDA=1 tests/run_tests.sh cuda

bench: $(BUILD)/pxq
	$(BUILD)/pxq bench

FUZZ_TARGETS := $(patsubst fuzz/%.c,$(BUILD)/fuzz/%,$(wildcard fuzz/fuzz_*.c))
fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang OPT=-O1 SAN="-fsanitize=fuzzer-no-link,address,undefined" build-fuzz/libpxq.a
	@mkdir -p build-fuzz/fuzz
	@for f in fuzz/fuzz_*.c; do n=$$(basename $$f .c); \
	  echo "clang $$f"; clang -std=c11 -g -O1 -D_GNU_SOURCE -Isrc -fsanitize=fuzzer,address,undefined \
	  $$(pkg-config --cflags $(PKGS)) -o build-fuzz/fuzz/$$n $$f build-fuzz/libpxq.a $(LDLIBS) || exit 1; done
	@echo "fuzzers in build-fuzz/fuzz; run on a copy of the seeds, e.g.:"
	@echo "  mkdir -p fuzz/corpus-work/gguf && cp fuzz/corpus/gguf/* fuzz/corpus-work/gguf/"
	@echo "  build-fuzz/fuzz/fuzz_gguf -dict=fuzz/gguf.dict -max_total_time=180 fuzz/corpus-work/gguf"

clean:
	rm -rf build build-asan build-fuzz build-sm70 build-ptx75 pxq

.PHONY: all tests test test-asan test-cuda bench fuzz clean FORCE
-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(CU_OBJ:.o=.d) $(TESTS:=.d) $(BENCHES:=.d)
