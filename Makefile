# luce — everyday entry points.
#   make demo    generate a small drafter checkpoint, convert it, inspect it (models/work/)
#   make test    fresh-machine safe: creates .venv, installs luce with its test extra, runs pytest
#   make build   (re)build and install the package and its native runtime into .venv
#   make bench   CPU benchmark table (see docs/benchmarks.md)
#   make lint    byte-compile + ruff when present
# Knobs: PYTHON=python3.11  JOBS=2  PYTEST_ARGS="-k quants"  LUCE_GPU=off|auto|cuda|hip

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
LUCE_GPU ?= auto
PYTEST_ARGS ?=

.PHONY: venv build test demo bench lint clean

$(VENV)/.ready: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.10" "cmake>=3.21" ninja
	@touch $@

venv: $(VENV)/.ready

# Non-editable install: tests always run the wheel a user would get. The CMake build
# directory (build/) is kept between runs, so a rebuild only recompiles what changed.
build: venv
	@echo "native: LUCE_GPU=$(LUCE_GPU)  nvcc: $$(command -v nvcc >/dev/null && echo ✓ || echo ✗)  hipcc: $$(command -v hipcc >/dev/null && echo ✓ || echo ✗)"
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PIP) install -q --no-build-isolation \
	  -Ccmake.define.LUCE_GPU=$(LUCE_GPU) ".[test]"

test: build
	$(PY) -m pytest -n $(JOBS) -q $(PYTEST_ARGS)

# The main job on bundled data: generate a small DFlash 2 checkpoint (models/make_demo_drafter.py,
# random weights, published layout), convert it to a drafter GGUF, and inspect the result.
DEMO := models/work/demo-drafter
demo: build
	$(PY) models/make_demo_drafter.py $(DEMO)
	$(VENV)/bin/luce convert $(DEMO) -o $(DEMO).gguf --force
	$(VENV)/bin/luce inspect $(DEMO).gguf

bench: build
	$(VENV)/bin/luce bench --help

lint: venv
	$(PY) -m compileall -q cli converters src native/binding tests

clean:
	rm -rf build .pytest_cache
