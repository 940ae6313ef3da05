# drape: the two commands (README.md, docs/getting-started.md).
#   make demo   create .venv, install, run the whole pipeline on the embedded demo config
#   make test   apt-install the services the tests start (root or sudo), then run the test suite
#   make lint   the formatter, the linter and the type checker (ruff format --check, ruff check, mypy)
# The comment line right above each target is its description on the documentation site
# (docs/hooks.py lists every .PHONY target with it).

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PREFECT_SERVER_ANALYTICS_ENABLED := false
# A first start of the ephemeral API (fresh database, cold imports) can exceed Prefect's 20 s.
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 60
export PREFECT_HOME ?= $(CURDIR)/.drape/prefect

.PHONY: demo test lint format install services serve rehearse clean image image-cpu docs docs-serve

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# torch first, its CPU build by name (`2.13.0+cpu`): on Linux PyPI's plain `torch==2.13.0` is the
# CUDA build, which brings CUDA's libraries as nvidia-* wheels. pip's configured indexes and
# find-links are tried first (the CI machine has the wheel on disk in find-links and cannot reach
# PyTorch's index), then PyTorch's index for the variant (PyPI has no `+cpu` build, so the first try
# fails at once elsewhere). TORCH_VARIANT=cu128 asks for a CUDA build; TORCH_INDEX names another index.
TORCH_VERSION := 2.13.0
TORCH_VARIANT ?= cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/$(TORCH_VARIANT)
TORCH := torch==$(TORCH_VERSION)+$(TORCH_VARIANT)
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet "$(TORCH)" 2>/dev/null \
	  || { echo "$(TORCH) is not on pip's configured indexes; trying $(TORCH_INDEX)"; \
	       $(BIN)/pip install --quiet "$(TORCH)" --index-url "$(TORCH_INDEX)"; }
	$(BIN)/pip install --quiet -e ".[test,docs]"
	# MTCNN's weights (drape/gates/recognizers/mtcnn.py reads facenet_pytorch/data/*.pt, never imports it):
	# --no-deps, as its pins (torch < 2.3, torchvision, numpy < 2) would replace torch 2.13 with 2.2's CUDA build
	$(BIN)/pip install --quiet --no-deps facenet-pytorch==2.6.0
	# clean-fid, the reference tests/unit/test_eval_clean_fid.py checks drape's FID resize against: --no-deps,
	# as it requires torchvision (for networks and folder readers drape does not use), which drape does not install
	$(BIN)/pip install --quiet --no-deps clean-fid==0.1.35
	touch $(STAMP)

# create .venv (Python 3.11) and install drape with its test and docs extras, torch's CPU build first
install: $(STAMP)

# Debian's Prometheus, promtool and Pushgateway (the tests that need them start them), and kubectl
# for `kubectl kustomize` (rendering infra/k8s; no cluster is contacted), PostgreSQL for the queue tests,
# and Tesseract (with its English model) for the gates' second OCR engine. Installed only when missing;
# apt-get runs as root, or through sudo. No daemon is left running: each test starts its own.
APT_PACKAGES := prometheus prometheus-pushgateway kubectl postgresql tesseract-ocr
# apt-get install what the tests start when missing (root or sudo): Prometheus, Pushgateway, kubectl, PostgreSQL, Tesseract, Slurm, munge
services:
	@if ! command -v prometheus-pushgateway >/dev/null || ! command -v promtool >/dev/null || ! command -v kubectl >/dev/null \
	     || ! command -v tesseract >/dev/null \
	     || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing $(APT_PACKAGES) with apt-get"; \
		export DEBIAN_FRONTEND=noninteractive; \
		$$SUDO apt-get install -y -q --no-install-recommends $(APT_PACKAGES) >/dev/null \
		  || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q --no-install-recommends $(APT_PACKAGES) >/dev/null; }; \
	fi
	@$(MAKE) --no-print-directory slurm-services
	@$(MAKE) --no-print-directory podman-services

# podman (with runc and catatonit for its pause container) plays the rendered pods of
# tests/integration/test_pods_play.py; debootstrap makes the image's Debian base (infra/image/build.sh).
PODMAN_PACKAGES := podman runc catatonit debootstrap
.PHONY: podman-services image-test
# the pod half of `make services`: podman, runc, catatonit and debootstrap (CONTAINERS_CONF=infra/image/containers.conf: /etc untouched)
podman-services:
	@if ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v catatonit >/dev/null \
	     || ! command -v debootstrap >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing $(PODMAN_PACKAGES) with apt-get"; \
		export DEBIAN_FRONTEND=noninteractive; \
		$$SUDO apt-get install -y -q --no-install-recommends $(PODMAN_PACKAGES) >/dev/null \
		  || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q --no-install-recommends $(PODMAN_PACKAGES) >/dev/null; }; \
	fi

# Debian's Slurm (slurmctld, slurmd, sbatch, sacct) and munge for tests/integration/test_slurm.py, which
# starts its own daemons with its own config (SLURM_CONF): a policy-rc.d that exits 101 keeps the
# packages from starting any at install, and one that was there before is put back.
SLURM_PACKAGES := slurm-wlm munge
.PHONY: slurm-services
# the Slurm half of `make services`: slurm-wlm and munge, with no daemon started at install
slurm-services:
	@if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		echo "installing $(SLURM_PACKAGES) with apt-get (no daemon started)"; \
		export DEBIAN_FRONTEND=noninteractive; \
		saved=$$(mktemp); had=0; \
		if [ -e /usr/sbin/policy-rc.d ]; then had=1; $$SUDO cp -p /usr/sbin/policy-rc.d "$$saved"; fi; \
		printf '#!/bin/sh\nexit 101\n' | $$SUDO tee /usr/sbin/policy-rc.d >/dev/null && $$SUDO chmod 755 /usr/sbin/policy-rc.d; \
		$$SUDO apt-get install -y -q --no-install-recommends $(SLURM_PACKAGES) >/dev/null \
		  || { $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q --no-install-recommends $(SLURM_PACKAGES) >/dev/null; }; \
		status=$$?; \
		if [ $$had = 1 ]; then $$SUDO cp -p "$$saved" /usr/sbin/policy-rc.d; else $$SUDO rm -f /usr/sbin/policy-rc.d; fi; \
		rm -f "$$saved"; exit $$status; \
	fi

# install, then run the whole pipeline on configs/demo.yaml (CPU, a few minutes) and print where to look
demo: $(STAMP)
	mkdir -p "$(PREFECT_HOME)"
	$(BIN)/drape demo

# a local Prefect server + deployments + a process worker; prints the UI URL and what to run
serve: $(STAMP)
	$(BIN)/drape serve

TEST_WORKERS ?= 3
# the whole test suite, after `make services`; TEST_WORKERS=3 pytest-xdist workers (0: one process)
# Three workers on a 2-core machine: with two, the cores sat idle 26% of a run (the Slurm, service
# and pod modules wait on daemons), and three took 849 s and 840 s where two took 959 s
# (benchmarks/README.md, "The test suite"). Each is given whole modules, the longest first
# (tests/conftest.py's LONGEST_FIRST; --no-loadscope-reorder, or xdist orders modules by their count
# of tests and the one-test rehearsal starts last). DRAPE_TEST_TIMES=<folder> writes each worker's
# per-file wall, CPU and sleep seconds there, which `$(BIN)/python -m tests.timing <folder>` tabulates
# with the estimate of the suite's time (tests/timing.py; benchmarks/README.md, "The test suite").
test: $(STAMP) services
	mkdir -p "$(PREFECT_HOME)"
	$(BIN)/python -m pytest -q $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

# the production path at CPU size with kills and resumes, alone (part of `make test`)
# What it runs and proves: docs/cluster.md, "The rehearsal"; its nodes: docs/topology.md.
rehearse: $(STAMP) services
	mkdir -p "$(PREFECT_HOME)"
	$(BIN)/python -m pytest -q -s tests/integration/test_rehearsal.py

# the formatter's check, the linter and the type checker: what CI runs before the tests
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

export NO_MKDOCS_2_WARNING := 1
# build the documentation site into .drape/site (strict: a broken link or a page left out of the nav fails)
# The config and CLI references and the lists of deployments, configs, commands and make targets are
# generated from the code as it builds (docs/hooks.py).
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

# preview the documentation site at http://127.0.0.1:8000, rebuilt as pages change
docs-serve: $(STAMP)
	$(BIN)/mkdocs serve

# rewrite the files the formatter would change and apply the linter's safe fixes
format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# remove .drape/: live storage, the object store, MLflow's database, Prefect's home, the built site
clean:
	rm -rf .drape

# The image every manifest names (queue.kubernetes.image, infra/k8s, deployments/): GPU (CUDA) and
# CPU variants of one Dockerfile; push it where the cluster pulls from.
IMAGE ?= ghcr.io/drape-ai/drape:0.1.0
# build the GPU image (CUDA runtime, torch's CUDA build), tagged IMAGE (ghcr.io/drape-ai/drape:0.1.0)
image:
	docker build --build-arg VARIANT=gpu -t $(IMAGE) .

# build the CPU image (python:3.11-slim, torch's CPU build), tagged IMAGE with -cpu appended
image-cpu:
	docker build --build-arg VARIANT=cpu -t $(IMAGE)-cpu .

# build localhost/drape:test with podman on a debootstrapped Debian 12 base (cached), then play a rendered stage pod in it
image-test: $(STAMP) podman-services
	infra/image/build.sh
	mkdir -p "$(PREFECT_HOME)"
	$(BIN)/python -m pytest -q -s tests/integration/test_pods_play.py
