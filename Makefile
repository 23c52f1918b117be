# pflx: the two commands of the README are `make demo` and `make test`; each installs what it needs.
PYTHON ?= python3
# A CPU build where one is provided locally; on a GPU machine `make TORCH=torch install` takes the CUDA build.
TORCH ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install test test-all demo bench scaling clean

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	@$(PYTHON) -m pip install -q -e ".[test]"

test: install
	$(PYTHON) -m pytest -q -m "not slow" $(PYTEST_ARGS)

test-all: install
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

demo: install
	bash recipes/quickstart/demo.sh runs/demo

# Exits 1 when any benchmark misses a target (each prints its figures beside the targets).
bench: install
	$(PYTHON) benchmarks/run.py

scaling: install
	$(PYTHON) benchmarks/scaling.py

clean:
	rm -rf runs .pytest_cache
