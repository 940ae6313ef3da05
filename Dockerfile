# syntax=docker/dockerfile:1
# drape's one image, for every pod of the cluster: flow pods, the queue's trainer pods, the
# dispatcher, the Prefect worker and MLflow (infra/k8s, deployments/, queue.kubernetes.image).
#   make image       the GPU variant: NVIDIA's CUDA runtime and cuDNN, torch's CUDA build
#   make image-cpu   the CPU variant: python:3.11-slim, torch's CPU build (the production path at CPU size)
# Both hold:
#   /opt/drape        this repository (flows/, configs/, deployments/): the deployments' working directory
#   /opt/venv         Python 3.11 with drape installed (`pip install .`), first on PATH: `python`, `drape`,
#                     `torchrun` (torch), `prefect` with its Kubernetes worker, `mlflow` (psycopg2 for the
#                     postgresql:// URIs of MLflow's backend store and of the queue)
#   user 10001:10001  the non-root user every securityContext names (queue.kubernetes.run_as_user)
# tests/unit/test_image.py checks these promises against the manifests without building the image.
ARG VARIANT=gpu
ARG DEBIAN_BASE=localhost/drape-base:bookworm

# Ubuntu 22.04 has Python 3.11 in its own archive (24.04 only through a PPA). PyPI's Linux torch
# is the CUDA build and brings its CUDA libraries as wheels; the base brings what the driver needs.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04 AS base-gpu
ARG TORCH_INDEX_URL=https://pypi.org/simple
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3.11 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" torch==2.13.0

# The CPU build by name, from PyTorch's CPU index, as `make install` installs it (Makefile).
FROM python:3.11-slim-bookworm AS base-cpu
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --index-url "$TORCH_INDEX_URL" "torch==2.13.0+cpu"

# The CPU build on a plain Debian 12 root file system (`make image-test`: infra/image/build.sh makes it
# with debootstrap and imports it as DEBIAN_BASE, where no registry serves base images). Debian's own
# Python 3.11; torch's CPU wheel from the `wheels` build context when it holds one (a folder of
# wheels: --build-context wheels=/opt/wheels, and TORCH_INDEX_URL empty where PyTorch's index is out of
# reach), else from PyTorch's CPU index.
FROM ${DEBIAN_BASE} AS base-debian
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
RUN --mount=type=bind,from=wheels,target=/wheels --mount=type=cache,target=/var/cache/pip --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && PIP_CACHE_DIR=/var/cache/pip /opt/venv/bin/pip install --find-links /wheels \
    ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "torch==2.13.0+cpu"

FROM base-${VARIANT} AS image
ENV PATH=/opt/venv/bin:$PATH \
    VIRTUAL_ENV=/opt/venv \
    HOME=/home/drape \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false
RUN groupadd --gid 10001 drape \
 && useradd --uid 10001 --gid 10001 --no-log-init --create-home --home-dir /home/drape --shell /usr/sbin/nologin drape
WORKDIR /opt/drape
COPY . /opt/drape
# torch is installed above (pinned as pyproject.toml pins it); prefect-kubernetes: `prefect worker
# start --type kubernetes` (infra/k8s/base/prefect-worker.yaml)
# pip's downloads are cached across builds (a cache mount, never in the image): a rebuild after a code change
# installs the same wheels again without fetching them. The `ca` secret (optional, never in a layer): the CA
# bundle of a TLS-inspecting proxy between the build and PyPI (infra/image/build.sh passes the host's).
RUN --mount=type=cache,target=/var/cache/pip --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
 && PIP_CACHE_DIR=/var/cache/pip pip install /opt/drape "prefect-kubernetes>=0.8,<0.9" "psycopg2-binary>=2.9,<3" \
 && rm -rf /opt/drape/build /opt/drape/drape.egg-info
# numeric, so the kubelet can verify runAsNonRoot
USER 10001:10001
CMD ["drape", "--help"]
