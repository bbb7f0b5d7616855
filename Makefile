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

.PHONY: all deps build demo test test-asan test-python fuzz clean

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

test: build
	ctest --test-dir $(BUILD) --output-on-failure

# CPU-only build under AddressSanitizer + UndefinedBehaviorSanitizer.
test-asan: deps
	cmake -S . -B $(BUILD)-asan -DNB_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug >/dev/null
	cmake --build $(BUILD)-asan -j $(JOBS)
	ctest --test-dir $(BUILD)-asan --output-on-failure

# libFuzzer on the safetensors reader for FUZZ_SECONDS, on a copy of the seed
# corpus (tests/corpus/safetensors/); fails on any crash, leak or sanitizer
# report.  Needs clang and its fuzzer runtime (installed when missing).
FUZZ_SECONDS ?= 120
fuzz: deps
	@missing=""; command -v clang >/dev/null 2>&1 || missing="$$missing clang"; \
	ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 || missing="$$missing libclang-rt-14-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	CC=clang cmake -S . -B $(BUILD)-fuzz -DNB_FUZZ=ON -DNB_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(BUILD)-fuzz -j $(JOBS) --target fuzz_safetensors
	rm -rf $(BUILD)-fuzz/corpus && mkdir -p $(BUILD)-fuzz/corpus
	cp tests/corpus/safetensors/* $(BUILD)-fuzz/corpus/
	cd $(BUILD)-fuzz && ./fuzz_safetensors -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -dict=$(CURDIR)/tests/corpus/safetensors.dict corpus

# The Python package (python/): CPU-only build into a fresh venv, then pytest.
test-python: deps
	rm -rf $(BUILD)-py && python3 -m venv $(BUILD)-py
	$(BUILD)-py/bin/pip install -q --upgrade pip
	$(BUILD)-py/bin/pip install -q numpy pytest
	NIBBLE_CUDA=OFF $(BUILD)-py/bin/pip install -q ./python
	cd $(BUILD)-py && NIBBLE_REQUIRE_IO=1 ./bin/python -m pytest -q $(CURDIR)/python/tests

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-fuzz $(BUILD)-py
