# Three commands do everything on a fresh machine (make lab opens the notebooks):
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
# The build named by its local version first (torch==2.13.0+cpu): PyPI has no such file, so
# this finds only a wheel that pip's own configuration already points at (a find-links
# folder or a local index, as on this project's CI machines) and fails in seconds
# elsewhere; then TORCH's index. It saves the minute pip spends retrying an index that a
# machine without internet access cannot reach.
TORCH_LOCAL := $(if $(and $(TORCH_INDEX),$(filter torch==%,$(TORCH_SPEC))),$(TORCH_SPEC)+$(TORCH))
PY          := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
TORCH_WANTED := $(VENV)/.torch-wanted
TORCH_STAMP := $(VENV)/.torch-installed
LAB_STAMP   := $(VENV)/.lab-installed

.PHONY: install test test-quick lint notebooks figures bench lab clean help FORCE
.PHONY: test-gpu gpu-check gpu-check-all gpu-tests gpu-tests-0 gpu-tests-1 gpu-tests-2
.PHONY: gpu-variants gpu-variants-all gpu-bench gpu-bench-all gpu-long gpu-train-time gpu-layout-time

help:
	@echo "make figures  - install, then regenerate every figure in figures/"
	@echo "make test     - install, then run pytest over tests/ and nbval over notebooks/"
	@echo "make test-quick - lint and the tests not marked slow (the inner loop), on every core"
	@echo "make lab      - install JupyterLab, then open the notebooks in it"
	@echo "make notebooks - re-execute every notebook in place (outputs committed)"
	@echo "make bench    - CPU attention benchmark (figures/data/bench_cpu.json, auto_cpu.json, compile_cpu.json, host_cost_cpu.json)"
	@echo "make lint     - ruff and the import-layer contract (part of make test)"
	@echo "TORCH=cpu (default) | cu128 | ... | pypi picks the PyTorch build (see Makefile)"
	@echo "make gpu-check OUT=dir - a GPU session in 9 minutes: the gpu tests, the variants and the"
	@echo "                        benchmark at the targets, the training time (docs/gpu.md;"
	@echo "                        each part alone: make gpu-variants, ...; every part: gpu-check-all)"

$(PY):
	$(PYTHON) -m venv $(VENV)

# The torch wanted, as a file rewritten only when it changes: a new TORCH or
# TORCH_SPEC makes it newer than the installed torch, which is then replaced.
$(TORCH_WANTED): FORCE | $(PY)
	@echo '$(TORCH_SPEC) $(TORCH_INDEX)' | cmp -s - $@ || echo '$(TORCH_SPEC) $(TORCH_INDEX)' > $@

$(TORCH_STAMP): $(TORCH_WANTED)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip uninstall --quiet --yes torch 2>/dev/null || true
	$(if $(TORCH_LOCAL),$(PY) -m pip install --quiet "$(TORCH_LOCAL)" 2>/dev/null || )$(PY) -m pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	touch $(TORCH_STAMP)

# Re-install the project when its requirements change (torch stays as installed).
$(STAMP): pyproject.toml Makefile $(TORCH_STAMP)
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Tests run on every core (at most 4: WORKERS=1 runs them in this process), one test file
# per worker (--dist loadfile), so that a notebook's cells stay in one kernel, in order.
WORKERS ?= auto
XDIST    = $(if $(filter 1,$(WORKERS)),,-n $(WORKERS) --maxprocesses 4 --dist loadfile)

test: $(STAMP) lint
	TRITON_INTERPRET=1 SPARSE_TRANSFORMER_FIGURES=$$(mktemp -d) $(PY) -m pytest tests notebooks --nbval --nbval-current-env \
		--nbval-sanitize-with notebooks/nbval_sanitize.cfg -p no:cacheprovider -q $(XDIST)
	@$(MAKE) --no-print-directory test-gpu

# The inner loop: lint and every test not marked slow (no notebooks, no subprocess runs,
# no training, no benchmark sweeps); a subpackage alone: make test-quick T=tests/fast/layout
T ?= tests
test-quick: $(STAMP) lint
	TRITON_INTERPRET=1 SPARSE_TRANSFORMER_FIGURES=$$(mktemp -d) $(PY) -m pytest $(T) -m "not slow" \
		-p no:cacheprovider -q $(XDIST)

# Style (ruff) and the layering rule: imports run downward only (docs/architecture.md).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

# Re-execute the notebooks in place, so their committed outputs are current.
notebooks: $(STAMP)
	TRITON_INTERPRET=1 $(PY) -m fast notebooks notebooks/*.ipynb

figures: $(STAMP)
	$(PY) -m fast figures
	$(MAKE) notebooks

bench: $(STAMP)
	$(PY) -m fast bench
	$(PY) -m fast bench --crossover
	$(PY) -m fast bench --compile
	$(PY) -m fast bench --host-cost

# JupyterLab (the "lab" extra) with the notebooks opened in it; the kernel is .venv's
# Python, which imports this checkout (installed editable). Notebooks run from
# notebooks/ or from the root alike (they find data through fast.experiments.paths).
$(LAB_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e ".[dev,lab]"
	touch $(LAB_STAMP)

lab: $(LAB_STAMP)
	$(VENV)/bin/jupyter lab notebooks

# GPU (docs/gpu.md). test-gpu: the tests marked gpu with the kernels compiled, when CUDA
# is present (one line saying why not otherwise). gpu-check: a GPU session, fitted to 9
# minutes of commands on an H100 / H200, results and logs under OUT, by one driver
# (python -m fast gpu-check, which needs no make: docs/gpu.md gives its command lines);
# each part is also its own target:
#   gpu-tests                 every gpu test, by pytest-xdist workers where installed
#   gpu-variants              every kernel variant at the target point (4, 16, 16384)
#   gpu-bench                 the benchmark at the targets' points (bench_cuda.json, .png)
#   gpu-train-time            Table 2's time per training iteration, with its floor
# and the longer ones, not in the session (gpu-check-all runs every part):
#   gpu-tests-0, -1, -2       the gpu tests split by kernel variant, one process each
#   gpu-variants-all          every kernel variant at every target point
#   gpu-bench-all             the whole benchmark (float16 and bfloat16, every n)
#   gpu-long                  the long sweep, n = 2^17 .. 2^20
#   gpu-layout-time           the host's part of a first call at n = 2^20
# They use $(PY) as it is: make install first, or pass PY=python3 where torch is installed.
# GPU_TEST_ARGS: more pytest arguments for the gpu tests, e.g. GPU_TEST_ARGS="-x -k strided";
# GPU_CHECK_ARGS: more driver options, e.g. GPU_CHECK_ARGS="--minutes 8" or "--dry-run".
OUT ?= gpu-results
GPU_CHECK = $(PY) -m fast gpu-check --out $(OUT) $(if $(GPU_TEST_ARGS),--test-args="$(GPU_TEST_ARGS)") $(GPU_CHECK_ARGS)

test-gpu:
	@if $(PY) -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
		TRITON_INTERPRET=0 $(PY) -m pytest tests -m gpu -p no:cacheprovider -q; \
	else echo "test-gpu: skipped (no CUDA device: torch.cuda.is_available() is False)"; fi

gpu-check:
	$(GPU_CHECK)

gpu-check-all:
	$(GPU_CHECK) --all

gpu-tests gpu-tests-0 gpu-tests-1 gpu-tests-2 gpu-variants gpu-variants-all gpu-bench gpu-bench-all gpu-long gpu-train-time gpu-layout-time:
	$(GPU_CHECK) --parts $(patsubst gpu-%,%,$@)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
