# Two commands do everything on a fresh machine:
#   make figures   create .venv, install, regenerate every figure (training included)
#   make test      create .venv, install, run pytest and nbval over the notebooks
#
# GPU users: make test TORCH_SPEC="torch==2.13.0 --index-url <your CUDA wheel index>"

PYTHON      ?= python3
VENV        ?= .venv
TORCH_SPEC  ?= torch==2.13.0
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed

.PHONY: install test lint notebooks figures bench clean help

help:
	@echo "make figures  - install, then regenerate every figure in figures/"
	@echo "make test     - install, then run pytest over tests/ and nbval over notebooks/"
	@echo "make notebooks - re-execute every notebook in place (outputs committed)"
	@echo "make bench    - CPU attention benchmark (figures/data/bench_cpu.json)"
	@echo "make lint     - ruff and the import-layer contract (part of make test)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# Re-install only when the project's requirements change.
$(STAMP): pyproject.toml Makefile | $(PY)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP) lint
	TRITON_INTERPRET=1 SPARSE_TRANSFORMER_FIGURES=$$(mktemp -d) $(PY) -m pytest tests notebooks --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider -q

# Style (ruff) and the layering rule: imports run downward only (docs/architecture.md).
lint: $(STAMP)
	$(VENV)/bin/ruff check fast reference tests
	$(VENV)/bin/lint-imports

# Re-execute the notebooks in place, so their committed outputs are current.
notebooks: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m fast notebooks notebooks/*.ipynb

figures: $(STAMP)
	$(PY) -m fast figures
	$(MAKE) notebooks

bench: $(STAMP)
	$(PY) -m fast bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
