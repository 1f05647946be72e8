# syntax=docker/dockerfile:1
# tailguard's two images, one target each, built from the repository root:
#
#   docker build --target runtime -t tailguard/runtime:0.1.0 .     # the batching model server
#   docker build --target operator -t tailguard/operator:0.1.0 .   # the kopf operator
#
# Without --target, docker builds the last stage: the runtime.
#
# Both images install the one Python distribution `tailguard` (pyproject.toml) into a virtual
# environment, /opt/tailguard, built in a stage that has compilers. The runtime gets the base
# install: no kopf, no kubernetes client, no matplotlib. The operator's build stage adds the
# `operator` extra (kopf, kubernetes, urllib3). Neither image has the `tools` extra (matplotlib).
# Each final stage copies the environment of its own build stage and has no compilers.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build stages: compilers and pip stay here ---------------------------------------------

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Compilers for any dependency without a binary wheel on this platform.
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY runtime/tailguard_runtime/ runtime/tailguard_runtime/
COPY operator/tailguard/ operator/tailguard/
# The base install, pinned to the versions CI tests: what the runtime image carries.
RUN python -m venv /opt/tailguard \
 && /opt/tailguard/bin/pip install -c constraints.txt . \
 && /opt/tailguard/bin/pip check

# The same environment plus the operator extra.
FROM build AS build-operator
RUN /opt/tailguard/bin/pip install -c constraints.txt '.[operator]' \
 && /opt/tailguard/bin/pip check

# --- what both final stages share: no compilers, a non-root user --------------------------

FROM ${PYTHON_IMAGE} AS base
LABEL org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --gid 10001 tailguard \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin tailguard
ENV PATH=/opt/tailguard/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

# --- tailguard/operator --------------------------------------------------------------------
# Turns InferenceServices into pods, Services and HPAs. Configured by TAILGUARD_* environment
# variables, which the Helm chart sets (charts/tailguard/templates/deployment.yaml): the runtime
# image and pod resources, the watched namespaces (comma-separated, empty = all), peering and
# liveness.

FROM base AS operator
LABEL org.opencontainers.image.title="tailguard-operator" \
      org.opencontainers.image.description="tailguard Kubernetes operator (kopf)"
COPY --from=build-operator /opt/tailguard /opt/tailguard
# Fail the build if the operator's modules or the packaged CRD are missing.
RUN python -c "import tailguard.operator.handlers, tailguard.spec.schema as s; s.crd()"
USER 10001:10001
# kopf's liveness endpoint (TAILGUARD_LIVENESS_ENDPOINT=http://0.0.0.0:8080/healthz in the chart).
EXPOSE 8080
ENTRYPOINT ["tailguard", "operator"]

# --- tailguard/runtime ---------------------------------------------------------------------
# The batching model server, one role (primary or fallback) per pod. Demo models need no
# network: builtin://<dataset>/<estimator> models train at startup on datasets that ship inside
# the scikit-learn wheel (iris, wine, breast_cancer, digits), and a build step below proves they
# load. A file:// model must be baked into an image derived from this one (see docs/kind.md).

FROM base AS runtime
LABEL org.opencontainers.image.title="tailguard-runtime" \
      org.opencontainers.image.description="tailguard model server (Open Inference Protocol v2, KServe v1)"
COPY --from=build /opt/tailguard /opt/tailguard
# One BLAS/OpenMP thread: the model thread owns its core (the server also limits threadpools at
# startup; these cover anything loaded before that).
ENV OMP_NUM_THREADS=1 \
    OPENBLAS_NUM_THREADS=1 \
    MKL_NUM_THREADS=1 \
    BLIS_NUM_THREADS=1 \
    NUMEXPR_NUM_THREADS=1
# Fail the build if a bundled demo dataset cannot be read offline, or if the gRPC protocol's
# compiled descriptors are missing (hack/proto/build.py writes them; make install runs it).
RUN python -c "from tailguard_runtime.models import DATASETS, load_dataset; [load_dataset(n) for n in DATASETS]" \
 && python -c "import tailguard_runtime.rpc.service"
USER 10001:10001
# HTTP (inference, health and /metrics, named `http` in the pods) and the Open Inference
# Protocol's gRPC service (spec.grpcPort, 8081 by default, named `grpc`).
EXPOSE 8080 8081
ENTRYPOINT ["tailguard-runtime"]
# The operator mounts the runtime config (a ConfigMap) at /etc/tailguard/runtime.json and adds
# `--role primary|fallback` to these arguments.
CMD ["--config", "/etc/tailguard/runtime.json", "--host", "0.0.0.0", "--port", "8080"]
