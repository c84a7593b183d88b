# Set-up and checks that work on a fresh Debian machine:
#   make demo   - map a generated sample image (installs what it needs)
#   make test   - the whole test suite, C unit tests included (CI runs this)
#   make bench  - benchmarks against qemu-img (and nbdcopy)
#   make test-sanitize - the suite with the core built under ASan/UBSan
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
SAMPLE_DIR ?= .corpus/sample
SAMPLE_SCALE ?= 0.0625

.PHONY: deps venv build demo test test-c test-sanitize bench clean

# Debian's qemu-utils and nbdkit are the oracles and the anchors; clang
# and its libFuzzer runtime fuzz the qcow2 parser.
deps:
	@missing=""; \
	command -v qemu-img >/dev/null || missing="$$missing qemu-utils"; \
	command -v nbdkit >/dev/null || missing="$$missing nbdkit"; \
	command -v nbdcopy >/dev/null || missing="$$missing libnbd-bin"; \
	command -v cc >/dev/null || missing="$$missing gcc"; \
	[ -f /usr/include/zlib.h ] || missing="$$missing zlib1g-dev"; \
	command -v clang >/dev/null || missing="$$missing clang"; \
	ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1 \
		|| missing="$$missing libclang-rt-14-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; \
	fi

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip setuptools wheel
	$(VPY) -m pip install -q -r requirements-test.txt

venv: $(VPY)

# -Werror here: a warning in the core fails the build, as in CI.
build: venv
	IMGCOPY_WERROR=1 $(VPY) -m pip install -q --no-build-isolation --no-deps --force-reinstall .

demo: deps build
	$(VPY) benchmarks/make_corpus.py $(SAMPLE_DIR) --scale $(SAMPLE_SCALE) --only sparse-6g.raw
	$(VPY) -m imgcopy map --output=json $(SAMPLE_DIR)/sparse-6g.raw > $(SAMPLE_DIR)/map.json
	$(VPY) -c "import imgcopy, json; m = imgcopy.map('$(SAMPLE_DIR)/sparse-6g.raw'); \
	print(m); print(json.dumps(m.summary(), indent=1))"
	@qemu-img map -f raw --output=json $(SAMPLE_DIR)/sparse-6g.raw | cmp - $(SAMPLE_DIR)/map.json \
		&& echo "imgcopy map == qemu-img map ($$(wc -l < $(SAMPLE_DIR)/map.json) extents)"

test-c:
	$(MAKE) -C tests/c check

test: deps build
	$(VENV)/bin/pytest -q -ra tests

# Python itself is not built with ASan: preload the runtime, ignore its leaks.
test-sanitize: deps venv
	IMGCOPY_SANITIZE=1 $(VPY) -m pip install -q --no-build-isolation --no-deps --force-reinstall .
	LD_PRELOAD="$$(cc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
		$(VENV)/bin/pytest -q -ra -p no:cacheprovider tests; \
	status=$$?; $(MAKE) build; exit $$status

bench: deps build
	$(VPY) benchmarks/bench_map.py

clean:
	rm -rf build *.egg-info $(VENV) .corpus
	$(MAKE) -C tests/c clean
