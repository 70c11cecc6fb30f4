# lipline: the commands a developer and CI use. `make help` lists them.
.DEFAULT_GOAL := help
PY := .venv/bin/python
PYTEST_ARGS ?=

.PHONY: help install demo test test-unit test-integration protos bench bench-cpu images chart clean

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

test-integration: install ## integration tests only (the four services as processes on 127.0.0.1)
	$(PY) -m pytest tests/integration $(PYTEST_ARGS)

protos: install ## regenerate the gRPC stubs from protos/
	$(PY) scripts/gen_protos.py --force

bench-cpu: install ## model micro-benchmarks on the CPU (small; GPU commands in bench/README.md)
	$(PY) bench/bench_models.py --device cpu --batch 4 --seconds 1

bench: bench-cpu ## alias of bench-cpu on machines without a GPU

IMAGE_REGISTRY ?= ghcr.io/lipline
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' helm/lipline/Chart.yaml)
CPU_BASE ?= python:3.11-slim-bookworm
CPU_TORCH ?= https://download.pytorch.org/whl/cpu

images: ## build the five images (needs a Docker engine): $(IMAGE_REGISTRY)/lipline-<service>:$(IMAGE_TAG)
	for s in audio render gateway; do docker build -f services/Dockerfile --build-arg SERVICE=$$s \
	  --build-arg BASE_IMAGE=$(CPU_BASE) --build-arg PROTOC_IMAGE=$(CPU_BASE) --build-arg TORCH_INDEX=$(CPU_TORCH) \
	  -t $(IMAGE_REGISTRY)/lipline-$$s:$(IMAGE_TAG) . || exit 1; done
	for s in lipsync superres; do docker build -f services/Dockerfile --build-arg SERVICE=$$s \
	  --build-arg PROTOC_IMAGE=$(CPU_BASE) -t $(IMAGE_REGISTRY)/lipline-$$s:$(IMAGE_TAG) . || exit 1; done

chart: install ## lint and render the Helm chart (what tests/helm checks, by hand)
	.venv/bin/helm lint --strict helm/lipline && .venv/bin/helm template lipline helm/lipline > /dev/null

clean: ## remove generated files and outputs (keeps .venv)
	rm -rf lipline outputs var .pytest_cache
