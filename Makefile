# Two entry points for a fresh machine (Python 3.11+ on PATH as python3):
#   make up     create .venv, install tailguard, serve examples/digits.yaml on 127.0.0.1:8080
#               (make up PORT=9090 EXAMPLE=examples/iris.yaml to change either)
#   make test   create .venv, install tailguard with its test tools (and helm; KServe's client
#               in .venv-kserve), build the project's images (hack/image/build.py: root and
#               debootstrap needed, ~2 min the first time), the Kubernetes control plane and node the tests run on
#               (kubelet, kube-proxy, containerd 2),
#               and the metrics pipeline the HPA reads (metrics-server, Prometheus, prometheus-adapter) (Go
#               needed; cached outside the clone, ~12 + ~10 min the first time), run the suite
#   make test-kube KUBE_VERSION=v1.34.4   the cluster tests against another pinned release
#   make crds   copy crds/*.yaml (the one source) into the operator package and the chart
VENV ?= .venv
PY := $(VENV)/bin/python
EXAMPLE ?= examples/digits.yaml
PORT ?= 8080
HELM_DIR ?= .ci/bin

.PHONY: up test test-kube install install-test proto bench clean crds

# The stamps make `make up` and `make test` install only when pyproject.toml or
# constraints.txt changed since the last install (or the venv is new).
INSTALLED := $(VENV)/.installed
INSTALLED_TEST := $(VENV)/.installed-test

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# PYTHONWARNINGS: setuptools' editable build prints a 12-line BuildBackendWarning (folders
# named like a package) that --quiet does not silence; nothing here acts on it.
$(INSTALLED): pyproject.toml constraints.txt | $(PY)
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -c constraints.txt -e '.[operator,tools,proto]'
	touch $@

$(INSTALLED_TEST): pyproject.toml constraints.txt | $(PY)
	PYTHONWARNINGS=ignore $(PY) -m pip install --quiet -c constraints.txt -e '.[test]'
	touch $@ $(INSTALLED)

# The gRPC protocol's descriptors, compiled from its pinned .proto into the runtime package
# (git ignores them); quick and silent when they are up to date.
proto: $(INSTALLED)
	@$(PY) hack/proto/build.py

install: $(INSTALLED) proto

# KServe's Python client, for the tests that use it, in a venv of its own (kserve 0.21.0 needs
# python-dateutil below 3; the kubernetes client in .venv needs 3 or above).
KSERVE_VENV ?= .venv-kserve
KSERVE_INSTALLED := $(KSERVE_VENV)/.installed

$(KSERVE_INSTALLED): tests/clients/kserve-requirements.txt
	python3 -m venv $(KSERVE_VENV)
	$(KSERVE_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KSERVE_VENV)/bin/python -m pip install --quiet -r tests/clients/kserve-requirements.txt
	touch $@

install-test: $(INSTALLED_TEST) proto $(KSERVE_INSTALLED)
	PYTHON=$(PY) bash scripts/install-helm.sh $(HELM_DIR)

up: install
	$(VENV)/bin/tailguard up $(EXAMPLE) --port $(PORT)

KUBE_VERSION ?= v1.37.2

# hack/kube/build.py (the control plane and the node), hack/metrics/build.py (metrics-server,
# Prometheus, prometheus-adapter) and hack/containerd/build.py (the node's containerd, its runc
# shim and ctr) print progress on stderr and their folder on stdout; without Go
# it stops with one line saying so. Three pytest-xdist workers (most tests wait on timers, the
# cluster and other processes more than they compute): the tests on the real node in one, those
# that need only a control plane in another (each starts one), the other modules shared between
# all three (tests/harness/groups.py groups them). test-kube runs the two cluster groups side by
# side on two workers.
test: install-test
	@python3 hack/image/build.py >/dev/null && \
	bin=$$(python3 hack/kube/build.py --tag $(KUBE_VERSION)) && \
	metrics=$$(python3 hack/metrics/build.py) && \
	containerd=$$(python3 hack/containerd/build.py) && \
	PATH="$(CURDIR)/$(HELM_DIR):$$PATH" TAILGUARD_KUBE_BIN="$$bin" TAILGUARD_METRICS_BIN="$$metrics" \
	TAILGUARD_CONTAINERD_BIN="$$containerd" \
	TAILGUARD_KUBE_VERSION=$(KUBE_VERSION) $(PY) -m pytest -n 3 --dist loadgroup

test-kube: install-test
	@python3 hack/image/build.py >/dev/null && \
	bin=$$(python3 hack/kube/build.py --tag $(KUBE_VERSION)) && \
	metrics=$$(python3 hack/metrics/build.py) && \
	containerd=$$(python3 hack/containerd/build.py) && \
	PATH="$(CURDIR)/$(HELM_DIR):$$PATH" TAILGUARD_KUBE_BIN="$$bin" TAILGUARD_METRICS_BIN="$$metrics" \
	TAILGUARD_CONTAINERD_BIN="$$containerd" \
	TAILGUARD_KUBE_VERSION=$(KUBE_VERSION) $(PY) -m pytest -m cluster -n 2 --dist loadgroup

# The copies are real files (no symlinks); tests/test_crd_copies.py fails while they differ.
crds:
	python3 hack/copy_crds.py

bench: install
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) $(KSERVE_VENV) $(HELM_DIR) .pytest_cache
