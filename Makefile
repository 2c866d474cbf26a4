# Thin wrapper over CMake.
#   make                 build into build/ (RelWithDebInfo)
#   make test            build, then the whole suite: unit, multi-process,
#                        conformance, Python, and every fuzz target's seed
#                        corpus replayed plus a fixed number of executions
#   make test-long       the long cases (pip install . from a fresh copy)
#   make test SANITIZE=1 the same, built into build-san/ with ASan + UBSan
#   make fuzz            timed fuzzing: every fuzz target for FUZZ_SECONDS
#                        seconds (default 60), two at a time; fails on a
#                        finding and says where the input was kept
#   make demo            the main job (ferry-lab demo): only the library,
#                        ferry and ferry-lab built
#   make bench           every benchmark of ferry-lab
#   make install PREFIX=DIR  libferry, headers, the ferry CLI and ferry.pc
#                        (ferry-lab, the demos and benchmarks, is not installed)
# The fuzz targets live in their own build, build-fuzz/ (clang, libFuzzer,
# ASan + UBSan), compiled once and shared by `make test`, `make test
# SANITIZE=1` and `make fuzz`.
SANITIZE ?= 0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# Tests three times the cores at once: most of a multi-process test's time
# is spent waiting on its processes, not computing (2 cores, quiet: 298 s
# at 4 at once, 237 s at 6, 239 s at 8; docs/testing.md).
TEST_JOBS ?= $(shell echo $$(( $(JOBS) * 3 )))
FUZZ_SECONDS ?= 60
FUZZ_JOBS ?= 2
FUZZ_BUILD := build-fuzz
ifeq ($(SANITIZE),1)
BUILD := build-san
CMAKE_FLAGS := -DFERRY_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD := build
CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=RelWithDebInfo
endif

.PHONY: all deps test test-long fuzz fuzz-build demo bench clean install

CONFIGURE = cmake -S . -B $(BUILD) $(CMAKE_FLAGS) -DFERRY_FUZZ_DIR=$(CURDIR)/$(FUZZ_BUILD)

# Everything: the library, ferry, ferry-lab, the tests and the Python package. A
# build first configured by `make demo` (no test framework then) is
# configured again once the full set of packages is there.
all: $(BUILD)/Makefile
	@scripts/deps.sh --check || scripts/deps.sh
	@grep -q '^CMOCKA_FOUND:INTERNAL=1' $(BUILD)/CMakeCache.txt || $(CONFIGURE)
	@$(MAKE) --no-print-directory -C $(BUILD) -j$(JOBS)

$(BUILD)/Makefile: CMakeLists.txt
	@scripts/deps.sh --check || scripts/deps.sh
	$(CONFIGURE)

fuzz-build: $(FUZZ_BUILD)/Makefile
	@$(MAKE) --no-print-directory -C $(FUZZ_BUILD) -j$(JOBS)

$(FUZZ_BUILD)/Makefile: CMakeLists.txt
	@scripts/deps.sh --check || scripts/deps.sh
	@command -v clang >/dev/null || { echo "ferry: clang not found; the fuzz targets (which make test runs) need clang and libclang-rt-14-dev: run scripts/deps.sh" >&2; exit 1; }
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=clang -DFERRY_FUZZ=ON

deps:
	scripts/deps.sh

test: all fuzz-build
	cd $(BUILD) && ctest --output-on-failure -j$(TEST_JOBS) -LE long

# The long cases (label "long": `pip install .` from a fresh copy, 2-3
# minutes), apart so that no one test decides `make test`'s wall time.
test-long: all
	cd $(BUILD) && ctest --output-on-failure -L long

fuzz: fuzz-build
	scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_JOBS)

# The main job, with only what it needs: the packages of the library and
# the programs (scripts/deps.sh --demo), and ferry-lab (the demo) and ferry
# (the cluster it starts) built.
demo:
	@scripts/deps.sh --check --demo || scripts/deps.sh --demo
	@[ -f $(BUILD)/Makefile ] || $(CONFIGURE)
	@echo "ferry: building the library, ferry and ferry-lab ($(JOBS) jobs; about 2 minutes on 2 cores the first time)"
	@$(MAKE) --no-print-directory -C $(BUILD) -j$(JOBS) ferry ferry-lab
	$(BUILD)/ferry-lab demo

bench: all
	$(BUILD)/ferry-lab bench engine --transport shm
	$(BUILD)/ferry-lab bench engine --transport tcp
	$(BUILD)/ferry-lab bench store
	$(BUILD)/ferry-lab bench exec
	$(BUILD)/ferry-lab bench weights
	$(BUILD)/ferry-lab bench weights --scale
	$(BUILD)/ferry-lab bench weights --torch
	$(BUILD)/ferry-lab bench plan --model kimi-k2 --src fsdp:256 --dst ep:16,tp:8
	$(BUILD)/ferry-lab bench sparse

clean:
	rm -rf build build-san build-fuzz

# `make install PREFIX=/opt/ferry`: libferry.so (versioned SONAME) and .a, the
# headers, the ferry CLI and lib/pkgconfig/ferry.pc under PREFIX.
PREFIX ?= /usr/local
install: all
	cmake --install $(BUILD) --prefix $(PREFIX)
