# Scaling Deep Learning: the two quick-start commands.
#   make lab            set up .venv, copy the exercises into work/ (your answers) and open the course in JupyterLab
#                       (make lab HEADLESS=1: no browser)
#   make test           set up .venv and run every test: unit tests, notebooks and solutions under nbval
# Other targets: make test-fast (unit tests only, for editing) | site (the course as a web site, in _build/site)
#                | setup | exercises | doctor | bench NAME=cpu-mnist | clean
#                | lock (re-lock after pyproject.toml changed) | latest (the suite on the newest releases)
#                | upgrade (latest, then adopt its lock when the suite passed)
PYTHON ?= python3
VENV   ?= .venv
# What .venv installs: exact versions with hashes, made from pyproject.toml by tools/lock.py (uv).
LOCK   ?= requirements.lock
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Test processes: pytest-xdist workers, each running whole files (a notebook's cells stay in one kernel); one
# per core, at most 4 (each worker with its kernels and launched ranks holds 1-2 GB).
JOBS   ?= $(shell $(PYTHON) -c "import os; print(min(4, len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1))" 2>/dev/null || echo 2)
# MNIST lives in the clone's data/ (git ignores it) unless COURSE_DATA_DIR says otherwise.
export COURSE_DATA_DIR ?= $(CURDIR)/data
# Jupyter refuses to run as root (containers, some classroom VMs) unless told it is deliberate.
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)
# Quick mode (COURSE_QUICK=1) runs the same code with fewer epochs and samples; COURSE_LOCK is what the
# installed versions are checked against (tests/test_lock.py, doctor).
PYTEST := COURSE_QUICK=1 TQDM_DISABLE=1 COURSE_LOCK=$(abspath $(LOCK)) $(BIN)/python -m pytest -p no:cacheprovider \
	-ra -n $(JOBS) --dist loadfile

.PHONY: setup lab test test-fast site exercises doctor bench lock latest upgrade clean

# pip checks every file against the lock's sha256 (hash-checking mode turns on with the first hash it reads).
# --no-deps: the lock already holds every dependency, and pip's resolver in hash mode refuses a locked package
# that another one asks for with an extra (jsonschema[format-nongpl]) once a newer release exists (pypa/pip#9644).
$(STAMP): $(LOCK) pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --no-deps -r $(LOCK)
	$(BIN)/python -m pip install --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

# work/ (git-ignored) is the learner's copy of exercises/, where answers go: created here, never overwritten
# (course_lib.learn.workcopy; `python -m course_lib work update` brings a changed exercise in beside the answers).
lab: $(STAMP)
	$(BIN)/python -m course_lib doctor || true
	$(BIN)/python -m course_lib work create
	$(BIN)/jupyter lab --notebook-dir=. $(if $(HEADLESS),--no-browser,) $(ROOT_FLAG) notebooks/00_start_here.ipynb

# pytest's exit code 5 (no test collected, e.g. a -k that matches nothing) is not a failure of the course.
# nbval runs the lectures, each in a fresh kernel. solutions/ runs in tests/test_exercises.py instead: one kernel
# for every exercise notebook (each from a reset namespace), every cell without an error; the practica's
# solutions are graded whole (tests/test_grade.py, test_checks_practicum_make_it_small.py).
test: $(STAMP)
	$(PYTEST) --nbval-lax --nbval-current-env --nbval-cell-timeout=600 --durations=20 $(PYTEST_ARGS) \
		tests notebooks || [ $$? -eq 5 ]

# The unit tests without the notebooks and the slow end-to-end tests (marked slow): minutes, for editing.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow" --durations=10 $(PYTEST_ARGS) tests || [ $$? -eq 5 ]

# Every lecture and exercise executed (outputs cached by content in _build/jupyter_cache), the instructor
# guide and the API reference; COURSE_SITE_PAGES="notebooks/07_ddp ..." builds only those pages.
site: $(STAMP)
	$(BIN)/python -m sphinx -b html -c docs . _build/site
	@echo "The site: _build/site/index.html  (serve it: $(BIN)/python -m http.server -d _build/site)"

exercises: $(STAMP)
	$(BIN)/python -m course_lib.exercises

doctor: $(STAMP)
	$(BIN)/python -m course_lib doctor

bench: $(STAMP)
	$(BIN)/python -m course_lib.bench $(or $(NAME),cpu-mnist)

lock: $(STAMP)
	$(BIN)/python -m pip install -q uv
	$(BIN)/python tools/lock.py

# The newest releases of everything in pyproject.toml, in .venv-latest: which packages moved, which tests broke.
# It needs only uv to resolve, so it starts from a bare .venv-latest, which then gets the newest lock.
latest upgrade:
	$(PYTHON) -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q uv packaging
	.venv-latest/bin/python tools/latest.py $(if $(filter upgrade,$@),--adopt,)

clean:
	rm -rf $(VENV) .venv-latest .pytest_cache _build docs/api docs/_generated
