# Thin wrapper over CMake. `make`, `make test`, `make demo`, `make bench`,
# `make install PREFIX=DIR`.
# SANITIZE=1 builds into build-san/ with AddressSanitizer + UBSan.
SANITIZE ?= 0
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
ifeq ($(SANITIZE),1)
BUILD := build-san
CMAKE_FLAGS := -DFERRY_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
else
BUILD := build
CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=RelWithDebInfo
endif

.PHONY: all deps test demo bench clean install

all: $(BUILD)/Makefile
	@$(MAKE) --no-print-directory -C $(BUILD) -j$(JOBS)

$(BUILD)/Makefile: CMakeLists.txt
	@scripts/deps.sh --check || scripts/deps.sh
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

deps:
	scripts/deps.sh

test: all
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

demo: all
	$(BUILD)/ferry demo

bench: all
	$(BUILD)/ferry bench engine --transport shm
	$(BUILD)/ferry bench engine --transport tcp
	$(BUILD)/ferry bench store
	$(BUILD)/ferry bench exec
	$(BUILD)/ferry bench weights
	$(BUILD)/ferry bench plan --model kimi-k2 --src fsdp:256 --dst ep:16,tp:8
	$(BUILD)/ferry bench sparse

clean:
	rm -rf build build-san build-fuzz

# `make install PREFIX=/opt/ferry`: libferry.so (versioned SONAME) and .a, the
# headers, the ferry CLI and lib/pkgconfig/ferry.pc under PREFIX.
PREFIX ?= /usr/local
install: all
	cmake --install $(BUILD) --prefix $(PREFIX)
