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

.PHONY: venv build test demo bench peer lint clean

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
	# Drafter parity oracles (tests/oracles/, docs/oracles.md). --no-deps: their metadata pins other
	# transformers releases (dflash: 5.15) and NeMo's full training stack; the modules used need only
	# torch + transformers, which the test extra already installs.
	$(PIP) install -q --no-deps dflash==0.1.0 nemo-automodel==0.7.0

test: build
	$(PY) -m pytest -n $(JOBS) -q $(PYTEST_ARGS)

# The main job on bundled data: generate a small DFlash 2 checkpoint (models/make_demo_drafter.py,
# random weights, published layout), convert it to a drafter GGUF, and inspect the result.
DEMO := models/work/demo-drafter
demo: build
	$(PY) models/make_demo_drafter.py $(DEMO)
	$(VENV)/bin/luce convert $(DEMO) -o $(DEMO).gguf --force
	$(VENV)/bin/luce inspect $(DEMO).gguf

# CPU benchmark against llama.cpp on a synthetic qwen35 file of a stated shape (docs/benchmarks.md).
BENCH_SHAPE ?= 0.8b
BENCH_MIX   ?= q8_0
BENCH_MODEL ?= models/work/synthetic-$(BENCH_SHAPE)-$(BENCH_MIX).gguf
PEER_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \
  -DGGML_AVX512_BF16=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF

$(BENCH_MODEL): models/synthetic_qwen35.py | venv
	@mkdir -p $(dir $@)
	$(PY) models/synthetic_qwen35.py --shape $(BENCH_SHAPE) --mix $(BENCH_MIX) -o $@

peer: venv
	$(PY) -c "import llama_cpp" 2>/dev/null || CMAKE_ARGS="$(PEER_CMAKE_ARGS)" \
	  CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PIP) install -q ".[bench]"

bench: build peer $(BENCH_MODEL)
	$(VENV)/bin/luce bench -m $(BENCH_MODEL) -p 512 -n 128 -t $(JOBS) -r 3 --peer llama.cpp

lint: venv
	$(PY) -m compileall -q cli converters src native/binding tests

clean:
	rm -rf build .pytest_cache
