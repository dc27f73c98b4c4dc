# Two commands on a fresh Debian/Ubuntu machine (each sets up what it needs, system packages included):
#   make book   # build the book into _build/html (warnings are errors)
#   make test   # run the whole test suite
# Quick loop while developing: make quick   (the tests not marked slow: about 2 minutes)

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: setup mathjax axe book book-instructor test quick release clean system-book system-test

$(BIN)/coursekit: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

setup: $(BIN)/coursekit

# Debian packages a job needs: installed as root or with sudo, else the exact command is printed
system-book system-test: system-%:
	scripts/system_deps.sh $*

mathjax:
	scripts/install_mathjax.sh

# the accessibility engine of the browser tests (tests/test_book.py, test_term.py, test_accessibility.py)
axe:
	scripts/install_axe.sh

book: system-book setup mathjax
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter-book build . -W -n --keep-going

# the instructor edition: the same pages with the code of every graded function shown (the student
# edition shows its signature and docstring); reuses the executed notebooks of `make book`
book-instructor: system-book setup mathjax
	COURSEKIT_EDITION=instructor PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/jupyter-book build . -W -n --keep-going \
		--path-output _build/instructor

test: system-test setup mathjax axe
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest

quick: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -m "not slow and not browser"

release: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/coursekit release

clean:
	rm -rf _build .pytest_cache
