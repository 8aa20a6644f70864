# Two commands do everything on a fresh machine:
#   make figures   create .venv, install, regenerate every figure (training included)
#   make test      create .venv, install, run pytest and nbval over the notebooks
# and one opens the notebooks in a browser:
#   make lab       install JupyterLab into .venv and open notebooks/ in it
#
# Which PyTorch build is installed: one variable, TORCH.
#   TORCH=cpu    (the default) the CPU build of torch 2.13.0 from download.pytorch.org/whl/cpu:
#                about 200 MB, for Linux, macOS and Windows; the CPU paths and the Triton
#                interpreter run on it.
#   TORCH=cu128  a CUDA build (cu126, cu128, ...: a CUDA version your driver supports),
#                from download.pytorch.org/whl/cu128; needed for the GPU kernels.
#   TORCH=pypi   whatever PyPI serves: on Linux x86-64 a CUDA build (several GB with its
#                NVIDIA libraries), the CPU build elsewhere.
# e.g. make test TORCH=cu128. Changing TORCH (or TORCH_SPEC, the version) reinstalls torch.

PYTHON      ?= python3
VENV        ?= .venv
TORCH       ?= cpu
TORCH_SPEC  ?= torch==2.13.0
TORCH_INDEX := $(if $(filter pypi,$(TORCH)),,https://download.pytorch.org/whl/$(TORCH))
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
TORCH_WANTED := $(VENV)/.torch-wanted
TORCH_STAMP := $(VENV)/.torch-installed
LAB_STAMP   := $(VENV)/.lab-installed

.PHONY: install test lint notebooks figures bench lab clean help FORCE
.PHONY: test-gpu gpu-check gpu-tests gpu-bench gpu-long gpu-train-time gpu-layout-time

help:
	@echo "make figures  - install, then regenerate every figure in figures/"
	@echo "make test     - install, then run pytest over tests/ and nbval over notebooks/"
	@echo "make lab      - install JupyterLab, then open the notebooks in it"
	@echo "make notebooks - re-execute every notebook in place (outputs committed)"
	@echo "make bench    - CPU attention benchmark (figures/data/bench_cpu.json)"
	@echo "make lint     - ruff and the import-layer contract (part of make test)"
	@echo "TORCH=cpu (default) | cu128 | ... | pypi picks the PyTorch build (see Makefile)"
	@echo "make gpu-check OUT=dir - GPU tests, benchmark, long sweep, training time (docs/gpu.md)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# The torch wanted, as a file rewritten only when it changes: a new TORCH or
# TORCH_SPEC makes it newer than the installed torch, which is then replaced.
$(TORCH_WANTED): FORCE | $(PY)
	@echo '$(TORCH_SPEC) $(TORCH_INDEX)' | cmp -s - $@ || echo '$(TORCH_SPEC) $(TORCH_INDEX)' > $@

$(TORCH_STAMP): $(TORCH_WANTED)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip uninstall --quiet --yes torch 2>/dev/null || true
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	touch $(TORCH_STAMP)

# Re-install the project when its requirements change (torch stays as installed).
$(STAMP): pyproject.toml Makefile $(TORCH_STAMP)
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

# JupyterLab (the "lab" extra) with the notebooks opened in it; the kernel is .venv's
# Python, which imports this checkout (installed editable). Notebooks run from
# notebooks/ or from the root alike (they find data through fast.experiments.paths).
$(LAB_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,lab]"
	touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab notebooks

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

# GPU_TEST_ARGS: more pytest arguments, e.g. GPU_TEST_ARGS="-k baseline" runs one kernel variant
gpu-tests:
	mkdir -p $(OUT)
	$(GPU_RUN) 'TRITON_INTERPRET=0 $(PY) -m pytest tests -m gpu -p no:cacheprovider -q -rA \
		$(GPU_TEST_ARGS) --junitxml=$(OUT)/gpu-tests.xml 2>&1 | tee $(OUT)/gpu-tests.log'

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
	$(GPU_RUN) '$(PY) -m fast layout-time 2>&1 | tee $(OUT)/layout-time.log'

gpu-check: gpu-tests gpu-bench gpu-long gpu-train-time gpu-layout-time

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
