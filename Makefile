# The two quick-start commands (see README.md). Both build the package first: the build directory
# (build/) persists, so only the first build compiles llama.cpp.
PYTHON ?= python3

.PHONY: install demo test bench fixtures clean

install:
	$(PYTHON) -m pip install '.[test,server]'

demo: install
	mtp-bindings demo

test: install
	pytest

bench: install
	$(PYTHON) -m pip install '.[bench]'
	mtp-bindings bench

fixtures:
	$(PYTHON) tools/make_fixtures.py

clean:
	rm -rf build vendor
