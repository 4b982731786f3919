# tinyddp: a thin wrapper around CMake. `make demo` and `make test` each do everything on a fresh
# Debian machine: install missing packages, configure, build, run.
BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
CTEST_FLAGS ?=

.PHONY: all deps configure build test test-gpu gpu-bundle test-asan test-tsan test-asan-comm-nn configure-asan configure-tsan demo bench data clean fixtures

all: build

# `make deps BENCH=1` also installs the peers make bench runs beside tinyddp (scripts/deps.sh --bench).
deps:
	@scripts/deps.sh $(if $(BENCH),--bench)

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >$(BUILD).configure.log 2>&1 || { cat $(BUILD).configure.log; exit 1; }
	@sed -n '/tinyddp .* configuration/,/tests\/bench/p' $(BUILD).configure.log

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Every CPU suite; GPU tests inside them skip with a message when no device is found (and the launcher
# tests when torchrun, mpirun or Slurm cannot be installed: scripts/deps.sh --tests). Then the comm
# and nn suites again under AddressSanitizer + UndefinedBehaviorSanitizer (the code that parses
# bytes from the network and from files, and runs threads): a second build folder, CUDA off.
# A failure in the first part does not stop the second: both always run, and make test fails if
# either did.
# Every test skipped at run time, and every suite run skipped under a CPU cap this CPU cannot run,
# is named at the end with its reason (TINYDDP_SKIP_LOG: test/test_skip.h, test/cpu_gemm_cap.sh).
SKIP_LOG = $(CURDIR)/$(BUILD)/skipped.log
test: build
	@scripts/deps.sh --tests
	@rm -f $(SKIP_LOG); status=0; \
	  (cd $(BUILD) && TINYDDP_SKIP_LOG=$(SKIP_LOG) ctest --output-on-failure -L cpu $(CTEST_FLAGS)) || status=1; \
	  $(MAKE) --no-print-directory test-asan-comm-nn TINYDDP_SKIP_LOG=$(SKIP_LOG) || status=1; \
	  scripts/list_skips.sh $(SKIP_LOG); \
	  exit $$status

# CUDA-vs-CPU checks of every kernel, and the collectives on GPUs; needs a machine with a GPU. It fails
# when no GPU test ran: TINYDDP_REQUIRE_GPU=1 (the default here) turns a test's "skipped: no GPU"
# into a failure that says why, and a build without CUDA, which has no GPU tests, fails with the
# configure step's reason.
TINYDDP_REQUIRE_GPU ?= 1
test-gpu: build
	@if grep -q 'CUDA *: no' $(BUILD).configure.log; then \
	  echo "make test-gpu: this build has no GPU tests: $$(grep -m1 'CUDA *: no' $(BUILD).configure.log | sed 's/^-- *//')"; exit 1; fi
	@cd $(BUILD) && TINYDDP_REQUIRE_GPU=$(TINYDDP_REQUIRE_GPU) ctest --output-on-failure --no-tests=error -L gpu $(CTEST_FLAGS)

# For GPU nodes that cannot build (air-gapped, no compiler, no dev packages): the GPU suite, the perf
# programs, dummy_mgpu, tinyddp-run, the two CUDA modules and the libraries they need that a bare CUDA
# node lacks, in one archive under 64 MiB with run_checks.sh inside (scripts/gpu_bundle.sh; docs/gpu.md).
GPU_BUNDLE_PROGRAMS = test_gpu all_reduce_perf all_gather_perf reduce_scatter_perf broadcast_perf dummy_mgpu tinyddp-run tinyddp-store
gpu-bundle: configure
	@if grep -q 'CUDA *: no' $(BUILD).configure.log; then \
	  echo "make gpu-bundle: this build has no CUDA: $$(grep -m1 'CUDA *: no' $(BUILD).configure.log | sed 's/^-- *//')"; exit 1; fi
	@cmake --build $(BUILD) -j $(JOBS) --target $(GPU_BUNDLE_PROGRAMS) tinyddp_cuda tinyddp_nccl
	@scripts/gpu_bundle.sh $(BUILD) $(BUILD)/tinyddp-gpu-bundle.tar.gz

# ---- sanitizers ----------------------------------------------------------------------------------
# CUDA off (the sanitizers cannot look inside the CUDA runtime). -O0 -g1, assertions on: half the
# compile time of -O1 -g (the build is most of the cost on 2 cores), and line tables are all a stack
# trace needs to name the lines. Any report fails the test (cmake/TinyddpSanitizers.cmake).
# (CMAKE_FLAGS, meant for the main build, is not passed on: `make test CMAKE_FLAGS=-DTINYDDP_CUDA=ON`
# must not turn CUDA on in the sanitizer builds.)
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
SAN_CMAKE_FLAGS = -DTINYDDP_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1"
ASAN_ENV = ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1 \
           UBSAN_OPTIONS=print_stacktrace=1
TSAN_ENV = TSAN_OPTIONS="second_deadlock_stack=1 suppressions=$(CURDIR)/scripts/tsan.supp"

configure-asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DTINYDDP_SANITIZE=address,undefined $(SAN_CMAKE_FLAGS) \
	  >$(ASAN_BUILD).configure.log 2>&1 || { cat $(ASAN_BUILD).configure.log; exit 1; }

configure-tsan: deps
	@cmake -S . -B $(TSAN_BUILD) -DTINYDDP_SANITIZE=thread $(SAN_CMAKE_FLAGS) \
	  >$(TSAN_BUILD).configure.log 2>&1 || { cat $(TSAN_BUILD).configure.log; exit 1; }

# Every CPU suite under ASan + UBSan, and under TSan.
test-asan: configure-asan
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && $(ASAN_ENV) ctest --output-on-failure -L cpu $(CTEST_FLAGS)

test-tsan: configure-tsan
	@cmake --build $(TSAN_BUILD) -j $(JOBS)
	@cd $(TSAN_BUILD) && $(TSAN_ENV) ctest --output-on-failure -L cpu $(CTEST_FLAGS)

# The part of test-asan that `make test` runs: only the comm and nn suites and what they link.
test-asan-comm-nn: configure-asan
	@cmake --build $(ASAN_BUILD) -j $(JOBS) --target test_comm test_nn
	@cd $(ASAN_BUILD) && $(ASAN_ENV) TINYDDP_SKIP_LOG=$(TINYDDP_SKIP_LOG) ctest --output-on-failure -R '^(comm|nn)$$' $(CTEST_FLAGS)

# The seed job on every GPU, or on 2 CPU workers where there is none (examples/dummy_mgpu). Builds
# only the libraries and that example: the suites, fuzzers and benchmarks wait for `make test`.
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target dummy_mgpu
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

# Every benchmark beside its peers (bench/run_all.sh). The peers come first (Open MPI, Gloo, PyTorch and
# gnuplot from Debian: scripts/deps.sh --bench), so that the build finds their libraries and builds
# their programs (bench/peers/); a peer that cannot be installed is skipped, saying so.
bench:
	@scripts/deps.sh --bench
	@$(MAKE) --no-print-directory build
	@bench/run_all.sh $(BUILD)

# Regenerates the PyTorch reference fixtures (needs Debian's python3-torch).
fixtures:
	@scripts/deps.sh python3-torch
	@for s in test/fixtures/make_*.py; do echo "$$s"; /usr/bin/python3 "$$s" test/fixtures || exit 1; done

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(BUILD).configure.log $(ASAN_BUILD).configure.log $(TSAN_BUILD).configure.log
