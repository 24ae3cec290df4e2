# syntax=docker/dockerfile:1
#
# model-agent image.   docker build -t model-agent:0.1.0 .
#
# Two stages on the same base image. The first builds a virtualenv from this source tree with every
# dependency pinned (pyproject.toml pins the direct ones, deploy/docker/constraints.txt the transitive
# ones and the build backend) and wheels only, so no compiler is ever needed. The second copies just
# that virtualenv: no compiler, no pip, no setuptools, no caches.
#
# The image runs as an unprivileged user (65532) by default. The Helm chart sets the user explicitly:
# root by default, only because the host models directory is normally owned by root (see values.yaml).
# Everything the agent writes besides the models goes to /tmp (mount an emptyDir there; the chart
# does, with a read-only root file system).
#
# Pin the base by digest for fully reproducible builds:
#   docker build --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PIP_ONLY_BINARY=:all: \
    PIP_CONSTRAINT=/src/deploy/docker/constraints.txt

RUN python -m venv /opt/model-agent

WORKDIR /src
# .dockerignore lets only pyproject.toml, README/LICENSE, src/ and the constraints file through.
COPY . .

# pip compiles the bytecode now: the root file system is read-only at run time.
RUN /opt/model-agent/bin/pip install . \
 && /opt/model-agent/bin/pip check \
 && /opt/model-agent/bin/python -m pip uninstall --yes pip setuptools wheel \
 && /opt/model-agent/bin/model-agent run --help > /dev/null


FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="model-agent" \
      org.opencontainers.image.description="Keeps model weights on Kubernetes nodes in agreement with OME BaseModels and ClusterBaseModels" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# The base image's own installer is not needed at run time (a base built without pip has none to remove).
RUN if python -m pip --version > /dev/null 2>&1; then python -m pip uninstall --yes --no-cache-dir pip setuptools wheel; fi \
 && groupadd --system --gid 65532 model-agent \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin model-agent

COPY --from=build /opt/model-agent /opt/model-agent

ENV PATH=/opt/model-agent/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    HF_HOME=/tmp/huggingface \
    HF_HUB_DISABLE_TELEMETRY=1

USER 65532:65532
WORKDIR /tmp
# /metrics, /healthz, /livez, /readyz (--port)
EXPOSE 8080

ENTRYPOINT ["model-agent", "run"]
