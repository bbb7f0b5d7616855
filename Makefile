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

.PHONY: all deps build demo test test-asan clean

all: build

# Tools the build needs, installed when missing (Debian/Ubuntu, as root or with sudo).
deps:
	@missing=""; for t in cmake gcc make; do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq cmake gcc make >/dev/null; \
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

clean:
	rm -rf $(BUILD) $(BUILD)-asan
