# Two entry points for a fresh machine (Python 3.11+ on PATH as python3):
#   make up     create .venv, install tailguard, serve examples/digits.yaml on 127.0.0.1:8080
#               (make up PORT=9090 EXAMPLE=examples/iris.yaml to change either)
#   make test   create .venv, install tailguard with its test tools (and helm), run the suite
VENV ?= .venv
PY := $(VENV)/bin/python
EXAMPLE ?= examples/digits.yaml
PORT ?= 8080
HELM_DIR ?= .ci/bin

.PHONY: up test install install-test bench clean

# The stamps make `make up` and `make test` install only when pyproject.toml or
# constraints.txt changed since the last install (or the venv is new).
INSTALLED := $(VENV)/.installed
INSTALLED_TEST := $(VENV)/.installed-test

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(INSTALLED): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e .
	touch $@

$(INSTALLED_TEST): pyproject.toml constraints.txt | $(PY)
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@ $(INSTALLED)

install: $(INSTALLED)

install-test: $(INSTALLED_TEST)
	PYTHON=$(PY) bash scripts/install-helm.sh $(HELM_DIR)

up: install
	$(VENV)/bin/tailguard up $(EXAMPLE) --port $(PORT)

test: install-test
	PATH="$(CURDIR)/$(HELM_DIR):$$PATH" $(PY) -m pytest

bench: install
	$(PY) bench/run.py

clean:
	rm -rf $(VENV) $(HELM_DIR) .pytest_cache
