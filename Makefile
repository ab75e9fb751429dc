# Every target bootstraps .venv on first use: `make lab` and `make test` are all a user needs.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NEWEST_STAMP = $(NEWEST)/.installed
TORCH_VERSION  := 2.13.0
TRITON_VERSION := 3.6.0
# The newest Triton on the package index when last checked (and the numpy it runs with): the
# kernel tests also run under it, in a second venv ($(NEWEST)). pyproject.toml's range ends there.
TRITON_NEWEST  := 3.9.0
NUMPY_NEWEST   := 2.4.6
NEWEST := .venv-newest
LAUNCHES := .launches
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
JOBS   ?= 2
NB     ?=
# a variable's text as one single-quoted shell word, as the user typed it (a `$` in a file name is
# neither make's nor the shell's to expand)
q = '$(subst ','\'',$(value $(1)))'
PIP    := $(PY) -m pip install -q --disable-pip-version-check
NPIP    = $(NEWEST)/bin/python -m pip install -q --disable-pip-version-check
# Tests run headless and quiet; `make lab` keeps the user's settings (figures need the inline backend).
TEST_ENV := MAMBALEARN_PROGRESS=0 MPLBACKEND=Agg

# The Triton-kernel tests (run under the pinned and under the newest Triton).
# (one or two files a kernel family: the variants' and cuts' own files run under the pinned Triton)
KERNEL_TESTS = $(filter-out tests/test_selective_scan_segments.py \
  tests/test_selective_scan_bwd_variants.py tests/test_ssd_split_backward.py, \
  $(wildcard tests/test_selective_scan*.py tests/test_ssd_*.py tests/test_step.py \
  tests/test_triton_scan.py tests/test_check_ch08.py tests/test_check_ch09.py tests/test_mamba3_triton.py))

.PHONY: help lab test test-browser browser exercises grade submit slides site bench doctor clean
.DEFAULT_GOAL := help

help:  ## this list (each target sets up .venv itself on first use)
	@echo "make TARGET [VAR=value]   (README.md: start here)"
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | \
	  sed -E 's/^([a-z-]+):.*## (.*)$$/\1\t\2/' | awk -F'\t' '{ printf "  %-13s %s\n", $$1, $$2 }'

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# torch: the CUDA build where an NVIDIA GPU is present, else the small CPU build (never the
	@# multi-GB CUDA wheel on a CPU machine). A local CPU wheel (pip --find-links) is used if present.
	@if $(PY) -c "import torch" 2>/dev/null; then :; \
	elif nvidia-smi -L >/dev/null 2>&1; then $(PIP) -c constraints.txt torch==$(TORCH_VERSION); \
	else $(PIP) --no-deps --no-index torch==$(TORCH_VERSION)+cpu 2>/dev/null \
	  || $(PIP) --no-deps torch==$(TORCH_VERSION)+cpu --index-url $(TORCH_CPU_INDEX); \
	  $(PIP) -c constraints.txt triton==$(TRITON_VERSION); fi
	$(PIP) -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

# torch as above (CPU build), the newest Triton and numpy, pytest; mambalearn from the work tree.
$(NEWEST_STAMP): constraints.txt Makefile
	@test -x $(NEWEST)/bin/python || $(PYTHON) -m venv $(NEWEST)
	@grep -v -E '^(numpy|triton)==' constraints.txt > $(NEWEST)/constraints.txt
	@if $(NEWEST)/bin/python -c "import torch" 2>/dev/null; then :; \
	elif nvidia-smi -L >/dev/null 2>&1; then $(NPIP) -c $(NEWEST)/constraints.txt \
	  torch==$(TORCH_VERSION); \
	else $(NPIP) --no-deps --no-index torch==$(TORCH_VERSION)+cpu 2>/dev/null \
	  || $(NPIP) --no-deps torch==$(TORCH_VERSION)+cpu --index-url $(TORCH_CPU_INDEX); fi
	$(NPIP) -c $(NEWEST)/constraints.txt \
	  triton==$(TRITON_NEWEST) numpy==$(NUMPY_NEWEST) pytest pytest-xdist hypothesis \
	  filelock sympy networkx jinja2 fsspec typing-extensions setuptools
	@touch $(NEWEST_STAMP)

lab: $(STAMP)  ## JupyterLab opened on notebooks/ (exercises/ beside it), localhost only, token auth on
	@# nbgrader's menus and server extensions off: grading is `make grade` (docs/GRADING.md)
	JUPYTER_CONFIG_PATH=$(CURDIR)/course/classroom/jupyter \
	  $(VENV)/bin/jupyter lab --ip=127.0.0.1 --no-browser --ServerApp.root_dir=. \
	  --LabApp.default_url=/lab/tree/notebooks $(if $(filter 0,$(shell id -u)),--allow-root,)

test: $(STAMP) $(NEWEST_STAMP) browser  ## everything: lint, layers, unit, property, notebooks, grading, slides, browser, newest Triton
	$(PY) -m ruff check mambalearn course tests tools bench
	$(VENV)/bin/lint-imports --no-cache
	@# each notebook runs once: tests/test_chapters_run.py executes every chapter (the copy the
	@# deck, widget and site tests share) and fails on any error, as nbval-lax would; and
	@# tests/test_grading.py runs every cell of every solution in the grader's box
	@# every kernel launch the tests, the chapters and the grader make in the interpreter is
	@# recorded, then built for sm_90 with Triton's compiler: what an H200 would refuse fails here
	rm -rf $(LAUNCHES)
	$(TEST_ENV) MAMBALEARN_RECORD_LAUNCHES=$(CURDIR)/$(LAUNCHES) $(PY) -m pytest -n $(JOBS) \
	  --dist loadfile -p no:cacheprovider --durations=30 tests
	$(PY) -m mambalearn.compiled $(LAUNCHES) --jobs $(JOBS) --cache .sm90-builds.json
	@echo "== the Triton-kernel tests again under Triton $(TRITON_NEWEST) (numpy $(NUMPY_NEWEST))"
	$(TEST_ENV) PYTHONPATH=$(CURDIR) $(NEWEST)/bin/python -m pytest -n $(JOBS) --dist loadfile \
	  -p no:cacheprovider $(KERNEL_TESTS)

exercises: $(STAMP)  ## (authors) exercises/ from solutions/, never over a student's changes [DRY=1] [FORCE=1]
	$(PY) -m mambalearn exercises $(if $(DRY),--dry-run,) $(if $(FORCE),--force,)

grade: $(STAMP)  ## make grade NB=exercises/ex01_discretization.ipynb | make grade CLASS=submissions/ EXERCISES=01,02|all [OUT=grades.csv] (docs/GRADING.md)
	@test -n $(call q,NB)$(call q,CLASS) || { echo "usage: make grade NB=notebook.ipynb | make grade CLASS=dir EXERCISES=01,02|all [OUT=grades.csv]"; exit 2; }
	@bash tools/browser-deps.sh bwrap  # each submission runs in a bubblewrap box (docs/GRADING.md)
	@# names reach the program as written: quoted here, never expanded by make or the shell
	@# (spaces, quotes, parentheses and $ are safe); exit status 1 means "graded, below full
	@# marks" (the report says so), only 2, an error, fails make
	@if [ -n $(call q,CLASS) ]; then set -- --class $(call q,CLASS) --exercises $(call q,EXERCISES) \
	  --out $(if $(value OUT),$(call q,OUT),grades.csv) --jobs "$(JOBS)"; else set -- $(call q,NB); fi; \
	$(PY) -m mambalearn grade "$$@" || [ $$? -eq 1 ]

submit: $(STAMP)  ## make submit NB=exercises/ex01_discretization.ipynb [STUDENT=name] [REPLACE=1]: check a notebook and package it in submission/ (earlier ones kept)
	@test -n $(call q,NB) || { echo "usage: make submit NB=notebook.ipynb [STUDENT=name] [REPLACE=1]"; exit 2; }
	@set -- $(call q,NB); [ -z $(call q,STUDENT) ] || set -- "$$@" --student $(call q,STUDENT); \
	$(PY) -m mambalearn submit "$$@" $(if $(REPLACE),--replace,)

test-browser: $(STAMP) browser  ## JupyterLab in headless Chromium, every deck checked (part of make test)
	$(TEST_ENV) $(PY) -m pytest -p no:cacheprovider tests/test_browser.py tests/test_slides_offline.py \
	  tests/test_slides_fit.py

browser:  ## Debian's chromium and npm, for the browser tests and offline decks (once)
	@bash tools/browser-deps.sh

slides: $(STAMP) browser  ## decks + PDFs in slides/ and slides/course.pdf [NB=03 for one chapter] [ONLINE=1: CDNs]
	$(PY) -m mambalearn slides $(NB) --out slides --pdf $(if $(ONLINE),--online,)

site: $(STAMP) browser  ## every chapter as a web page in site/ (offline; ONLINE=1: CDNs) [COLAB=owner/repo: the repository for "open in Colab"]
	$(PY) -m mambalearn site --out site --pdf --jobs $(JOBS) $(if $(ONLINE),--online,) \
	  $(if $(COLAB),--colab $(COLAB),)

bench: $(STAMP)  ## time every backend (GPU: docs/BENCHMARKS.md's shapes; CPU: interpreter, tiny)
	$(PY) -m mambalearn bench --json bench-results.json

doctor: $(STAMP)  ## versions, GPU or interpreter mode, a tiny Triton scan checked
	$(PY) -m mambalearn doctor

clean:  ## remove .venv, .venv-newest and everything built (slides, site, bench results)
	rm -rf $(VENV) $(NEWEST) slides site bench-results.json $(LAUNCHES) .sm90-builds.json
