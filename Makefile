# Scaling Deep Learning: the two quick-start commands.
#   make lab            set up .venv and open the course in JupyterLab (make lab HEADLESS=1: no browser)
#   make test           set up .venv and run every test: unit tests, notebooks and solutions under nbval
# Other targets: make site (the course as a web site, in _build/site) | setup | exercises | doctor
#                | bench NAME=cpu-mnist | clean
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# MNIST lives in the clone's data/ (git ignores it) unless COURSE_DATA_DIR says otherwise.
export COURSE_DATA_DIR ?= $(CURDIR)/data
# Jupyter refuses to run as root (containers, some classroom VMs) unless told it is deliberate.
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

.PHONY: setup lab test site exercises doctor bench clean

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m pip install --no-deps -e .
	touch $(STAMP)

setup: $(STAMP)

lab: $(STAMP)
	$(BIN)/python -m course_lib doctor || true
	$(BIN)/jupyter lab --notebook-dir=. $(if $(HEADLESS),--no-browser,) $(ROOT_FLAG) notebooks/00_start_here.ipynb

# Quick mode (COURSE_QUICK=1) runs the same code with fewer epochs and samples.
test: $(STAMP)
	COURSE_QUICK=1 TQDM_DISABLE=1 $(BIN)/python -m pytest --nbval-lax --nbval-current-env \
		--nbval-cell-timeout=600 -p no:cacheprovider -ra tests notebooks solutions

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

clean:
	rm -rf $(VENV) .pytest_cache _build docs/api docs/_generated
