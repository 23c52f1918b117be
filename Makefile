# pflx: the two commands of the README are `make demo` and `make test`; each installs what it needs.
#
# Where it installs: the active environment when one is active (VIRTUAL_ENV for a venv or
# virtualenv, CONDA_PREFIX for a conda env), otherwise the project's own `.venv`, created on first
# use from $(PYTHON). Never the interpreter's global site-packages, which a stock Debian/Ubuntu
# Python refuses (PEP 668, "externally-managed-environment"). `make VENV=DIR ...` picks another.
PYTHON ?= python3
VENV ?= $(or $(VIRTUAL_ENV),$(CONDA_PREFIX),.venv)
PY := $(VENV)/bin/python
# A CPU build where one is provided locally; on a GPU machine `make TORCH=torch install` takes the CUDA build.
TORCH ?= torch==2.13.0
# `make test` installs the test extras: hf, peft and flower so their tests run (markers `hf`, `peft` and `flower`),
# docs so the site is built (`mkdocs build --strict`), tensorboard, wandb and mlflow for `--log tensorboard|wandb|mlflow`,
# models for the torchvision: and timm: client nets (marker `models`).
# `make demo` installs the runtime and nothing else.
EXTRAS ?= test,hf,peft,flower,docs,tensorboard,wandb,mlflow,models
PYTEST_ARGS ?=

.PHONY: install install-runtime test test-docs test-postgres test-all docs demo bench scaling clean

# Only the project's .venv is ever created here; an active environment already has its python.
$(VENV)/bin/python:
	@echo "creating the virtual environment $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv "$(VENV)" || { rm -rf "$(VENV)"; \
	  echo "error: '$(PYTHON) -m venv' failed. On Debian/Ubuntu: sudo apt install python3-venv" \
	       "(or python3.X-venv); or activate any virtual environment and re-run make." >&2; exit 1; }

# The runtime only: torch (kept when present), then pflx and its core dependencies.
install-runtime: $(PY)
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	@$(PY) -m pip install -q -e .

install: install-runtime
	@$(PY) -m pip install -q -e ".[$(EXTRAS)]"

# The documentation site, strict: a broken link, a page missing from the nav or a command page whose
# generated option table fails to build is an error (a few seconds).
MKDOCS_BUILD = NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir site

# Three steps: the default tier (minutes), the docs tier (every command of the README, the tutorials and the
# recipes, executed at smoke size: tests/docs/executed.py) and the site. Slow learning tests run in test-all.
test: install
	$(PY) -m pytest -q -m "not slow and not docs" $(PYTEST_ARGS)
	$(PY) -m pytest -q -m docs $(PYTEST_ARGS)
	$(MKDOCS_BUILD)

test-docs: install
	$(PY) -m pytest -q -m docs $(PYTEST_ARGS)

# The postgres tier (tests/tune/postgres; not in `test`): `pflx tune --storage postgresql://...` from several
# processes against a real server. A throwaway one (PostgreSQL's initdb and pg_ctl, Debian's `postgresql` package:
# .ci/run installs it) is started for the tier and stopped after it whatever the tier's result, which is make's.
test-postgres: install-runtime
	@$(PY) -m pip install -q -e ".[test,postgres]"
	@dir=$$(mktemp -d /tmp/pflx-pg-XXXXXX) && chmod 755 "$$dir" && \
	  url=$$($(PY) tests/tune/postgres/server.py start "$$dir/server") && echo "PostgreSQL server at $$url" && \
	  PFLX_TEST_POSTGRES="$$url" $(PY) -m pytest -q -m postgres tests/tune/postgres $(PYTEST_ARGS); rc=$$?; \
	  $(PY) tests/tune/postgres/server.py stop "$$dir/server"; rmdir "$$dir"; exit $$rc

docs: install
	$(MKDOCS_BUILD)

test-all: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The demo script calls `python -m pfl_cli`: the environment's bin/ goes first on PATH.
demo: install-runtime
	PATH="$(abspath $(VENV))/bin:$$PATH" bash recipes/quickstart/demo.sh runs/demo

# Exits 1 when any benchmark misses a target (each prints its figures beside the targets).
bench: install
	$(PY) benchmarks/run.py

scaling: install
	$(PYTHON) benchmarks/scaling.py

clean:
	rm -rf runs site .pytest_cache
