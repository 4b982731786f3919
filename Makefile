# tinyddp: a thin wrapper around CMake. `make demo` and `make test` each do everything on a fresh
# Debian machine: install missing packages, configure, build, run.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps configure build test test-gpu test-asan test-tsan demo bench data clean fixtures

all: build

deps:
	@scripts/deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }
	@sed -n '/tinyddp .* configuration/,/tests\/bench/p' $(BUILD).configure.log

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Every CPU suite; GPU tests inside them skip with a message when no device is found.
test: build
	@cd $(BUILD) && ctest --output-on-failure -L cpu $(CTEST_FLAGS)

# CUDA-vs-CPU checks of every kernel; needs a machine with a GPU.
test-gpu: build
	@cd $(BUILD) && ctest --output-on-failure -L gpu $(CTEST_FLAGS)

test-asan:
	@$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DTINYDDP_SANITIZE=address,undefined -DTINYDDP_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo"

test-tsan:
	@$(MAKE) test BUILD=build-tsan CMAKE_FLAGS="-DTINYDDP_SANITIZE=thread -DTINYDDP_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo"

# The seed job on every GPU, or on 2 CPU workers where there is none (examples/dummy_mgpu).
demo: build
	@$(BUILD)/bin/dummy_mgpu --save $(BUILD)/dummy_model.safetensors

# The UCI handwritten digits for examples/digits (build/bin/digits --data data/digits.csv.gz): the file
# scikit-learn ships, taken from Debian's python3-sklearn package, downloaded and unpacked here, not installed.
SKLEARN_DIGITS = usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz
data:
	@mkdir -p data
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	  { apt-get download python3-sklearn >/dev/null 2>&1 || \
	    { [ "$$(id -u)" -eq 0 ] && apt-get update -qq && apt-get download python3-sklearn >/dev/null 2>&1; } || \
	    { echo "make data: apt-get download python3-sklearn failed; hint: run 'sudo apt-get update' first"; exit 1; }; } && \
	  dpkg -x python3-sklearn_*.deb unpacked && cp unpacked/$(SKLEARN_DIGITS) "$(CURDIR)/data/digits.csv.gz"
	@echo "data/digits.csv.gz: $$(gzip -dc data/digits.csv.gz | wc -l) rows (64 pixel counts and the label on each)"

bench: build
	@bench/run_all.sh $(BUILD)

# Regenerates the PyTorch reference fixtures (needs Debian's python3-torch).
fixtures:
	@scripts/deps.sh python3-torch
	@for s in test/fixtures/make_*.py; do echo "$$s"; /usr/bin/python3 "$$s" test/fixtures || exit 1; done

clean:
	@rm -rf $(BUILD) build-asan build-tsan $(BUILD).configure.log
