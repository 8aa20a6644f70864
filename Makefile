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
.PHONY: test-gpu gpu-check gpu-tests gpu-bench gpu-long gpu-train-time gpu-layout-time

help:
	@echo "make figures  - install, then regenerate every figure in figures/"
	@echo "make test     - install, then run pytest over tests/ and nbval over notebooks/"
	@echo "make notebooks - re-execute every notebook in place (outputs committed)"
	@echo "make bench    - CPU attention benchmark (figures/data/bench_cpu.json)"
	@echo "make lint     - ruff and the import-layer contract (part of make test)"
	@echo "make gpu-check OUT=dir - GPU tests, benchmark, long sweep, training time (docs/gpu.md)"

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
	@$(MAKE) --no-print-directory test-gpu

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

# GPU (docs/gpu.md). test-gpu: the tests marked gpu with the kernels compiled, when CUDA
# is present (one line saying why not otherwise). gpu-check: those tests, the benchmark,
# its long sweep, Table 2's training time and the layout build time, results under OUT;
# each part is its own target (a lent machine may limit one command to 10 minutes).
# They use $(PY) as it is: make install first, or pass PY=python3 where torch is installed.
OUT ?= gpu-results
GPU_RUN = bash -o pipefail -c

test-gpu:
	@if $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		TRITON_INTERPRET=0 $(PY) -m pytest tests -m gpu -p no:cacheprovider -q; \
	else echo "test-gpu: skipped (no CUDA device: torch.cuda.is_available() is False)"; fi

gpu-tests:
	mkdir -p $(OUT)
	$(GPU_RUN) 'TRITON_INTERPRET=0 $(PY) -m pytest tests -m gpu -p no:cacheprovider -q -rA \
		--junitxml=$(OUT)/gpu-tests.xml 2>&1 | tee $(OUT)/gpu-tests.log'

gpu-bench:
	mkdir -p $(OUT)
	$(GPU_RUN) '$(PY) -m fast bench --device cuda --out $(OUT) 2>&1 | tee $(OUT)/bench.log'

gpu-long:
	mkdir -p $(OUT)/long
	$(GPU_RUN) '$(PY) -m fast bench --device cuda --only-long --out $(OUT)/long 2>&1 \
		| tee $(OUT)/long/bench.log'

gpu-train-time:
	mkdir -p $(OUT)
	$(GPU_RUN) '$(PY) -m fast train-time --out $(OUT) 2>&1 | tee $(OUT)/train-time.log'

gpu-layout-time:
	mkdir -p $(OUT)
	$(GPU_RUN) '$(PY) -m fast.experiments.layout_time 2>&1 | tee $(OUT)/layout-time.log'

gpu-check: gpu-tests gpu-bench gpu-long gpu-train-time gpu-layout-time

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
