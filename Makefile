# The two commands a new user runs:  make demo   and   make test
# Both configure and build with CMake first (CUDA kernels when nvcc is found).
# Variables: BUILD (build dir), ARCHS (CUDA architectures, default 80;89;90a), JOBS.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ARCHS ?=
CMAKE_ARGS ?=
ifneq ($(ARCHS),)
CMAKE_ARGS += -DCMAKE_CUDA_ARCHITECTURES="$(ARCHS)"
endif

.PHONY: all deps build demo test test-asan test-python test-gpu-sanitize test-gpu-soak fuzz clean

all: build

# Tools the build needs, installed when missing (Debian/Ubuntu, as root or with sudo).
deps:
	@missing=""; for t in cmake gcc make; do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	[ -f /usr/include/cjson/cJSON.h ] || missing="$$missing libcjson-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

build: deps
	cmake -S . -B $(BUILD) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	./$(BUILD)/nibble demo

# (the GPU soak, label "soak", takes minutes: make test-gpu-soak)
test: build
	ctest --test-dir $(BUILD) --output-on-failure -LE soak

# On a GPU machine: compute-sanitizer memcheck, racecheck and synccheck over
# every GPU test binary, one summary line per run (scripts/gpu-sanitize).
test-gpu-sanitize: build
	scripts/gpu-sanitize $(BUILD)

# On a GPU machine: 10^6 nb_gemm launches in CUDA graphs, checked at intervals.
test-gpu-soak: build
	ctest --test-dir $(BUILD) --output-on-failure -L soak

# CPU-only build under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(BUILD)-asan -DNB_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS)
	ctest --test-dir $(BUILD)-asan --output-on-failure

# libFuzzer on the checkpoint readers for FUZZ_SECONDS in total, split over
# five targets (a third to the safetensors reader, a sixth each to the GGUF
# reader, the index/config readers, checkpoint classification and `nibble
# quantize` on the CPU), each on a copy of its seed corpus
# (tests/corpus/<target>/); fails on any crash, leak or sanitizer report.
# Needs clang and its fuzzer runtime (installed when missing).
FUZZ_SECONDS ?= 120
FUZZ_ST = $(shell echo $$(( $(FUZZ_SECONDS) / 3 > 1 ? $(FUZZ_SECONDS) / 3 : 1 )))
FUZZ_REST = $(shell echo $$(( $(FUZZ_SECONDS) / 6 > 1 ? $(FUZZ_SECONDS) / 6 : 1 )))
fuzz: deps
	@missing=""; command -v clang >/dev/null 2>&1 || missing="$$missing clang"; \
	ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || missing="$$missing libclang-rt-14-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	CC=clang cmake -S . -B $(BUILD)-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_safetensors fuzz_gguf fuzz_config fuzz_ckpt fuzz_quantize
	for t in safetensors gguf config ckpt quantize; do \
	  rm -rf $(BUILD)-fuzz/corpus-$$t && mkdir -p $(BUILD)-fuzz/corpus-$$t && \
	  cp tests/corpus/$$t/* $(BUILD)-fuzz/corpus-$$t/ || exit 1; \
	done
	cd $(BUILD)-fuzz && ./fuzz_safetensors -max_total_time=$(FUZZ_ST) -print_final_stats=1 \
	  -dict=$(CURDIR)/tests/corpus/safetensors.dict corpus-safetensors
	cd $(BUILD)-fuzz && ./fuzz_gguf -max_total_time=$(FUZZ_REST) -print_final_stats=1 corpus-gguf
	cd $(BUILD)-fuzz && ./fuzz_config -max_total_time=$(FUZZ_REST) -print_final_stats=1 \
	  -dict=$(CURDIR)/tests/corpus/config.dict corpus-config
	cd $(BUILD)-fuzz && ./fuzz_ckpt -max_total_time=$(FUZZ_REST) -print_final_stats=1 \
	  -dict=$(CURDIR)/tests/corpus/safetensors.dict corpus-ckpt
	cd $(BUILD)-fuzz && ./fuzz_quantize -max_total_time=$(FUZZ_REST) -max_len=32768 -print_final_stats=1 \
	  -dict=$(CURDIR)/tests/corpus/safetensors.dict corpus-quantize

# The Python package (python/): CPU-only build into a fresh venv, then pytest.
# PY_TEST_DEPS: what the torch and transformers tests need (PyPI's torch
# wheel brings its CUDA libraries: about 90 s and 5.6 GB uncached, measured
# 2026-11-24); bitsandbytes (its CPU backend) for the tests against its own
# 4-bit quantization and serialization; hqq (its CPU quantizer) for the
# int4_hqq tests against HQQ's own dequantization; `make test-python
# PY_TEST_DEPS=` runs the numpy tests only (the others skip).
PY_TEST_DEPS ?= torch transformers accelerate bitsandbytes hqq
test-python: deps
	rm -rf $(BUILD)-py && python3 -m venv $(BUILD)-py
	$(BUILD)-py/bin/pip install -q --upgrade pip
	$(BUILD)-py/bin/pip install -q numpy pytest $(PY_TEST_DEPS)
	NIBBLE_CUDA=OFF $(BUILD)-py/bin/pip install -q ./python
	cd $(BUILD)-py && NIBBLE_REQUIRE_IO=1 ./bin/python -m pytest -q $(CURDIR)/python/tests

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(BUILD)-py
