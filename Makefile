# Tasks: `make test` (the fast CPU set), `make test-slow`, `make lint` (ruff, and every dated
# report, the index and the README headline against the results they are written from),
# `make gpu` (the GPU tests; on a CUDA host), `make regime` (the regime ladder, then its dated
# report: DIR=... COMMAND=... as it ran).
PYTHON ?= python
DIR ?= gpu_out

.PHONY: test test-slow lint gpu regime

test:
	$(PYTHON) -m pytest -q tests

test-slow:
	$(PYTHON) -m pytest -q -m slow tests

lint:
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mtplab.cli report all --check

gpu:
	bash scripts/gpu_check.sh -o $(DIR) tests

regime:
	bash scripts/gpu_check.sh -o $(DIR) regime
	$(PYTHON) -m mtplab.cli report regime --from $(DIR)/regime \
	    --command "bash scripts/gpu_check.sh regime"
