# Two commands do all set-up on a fresh machine (Python >= 3.11 with venv):
#   make demo   - venv, install, then a real agent + embedded nats-server on a simulated GPU node
#   make test   - venv, install, lint, type-check and the whole test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DURATION ?= 30
# The image the Kubernetes manifests run (deploy/kubernetes/), tagged with the project's version.
IMAGE ?= ghcr.io/gpu-node-agent/gpu-node-agent
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_OUT ?= build/image

.PHONY: demo test lint test-slow bench clean image image-push docker-image

$(BIN)/.installed: pyproject.toml
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

demo: $(BIN)/.installed
	$(BIN)/gpu-node-agent demo --duration $(DEMO_DURATION)

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The suite starts the agent and the central services as processes a few hundred times: their modules are
# compiled once first, as a pip install leaves them (an editable install compiles on import, and not at all
# under PYTHONDONTWRITEBYTECODE: ~0.35 s more per process start; the suite took 661 s instead of ~590 s).
# __pycache__ is ignored by git.
COMPILED := agent collectors fleet gna_sdk gna_types remediations sim
# Most of the suite waits: on nats-server elections, agents starting, crash-and-restart loops, a browser. One
# pytest-xdist worker per core (at most 4) overlaps those waits: 600 s -> ~340 s on a 2-core machine. A test
# file runs whole on one worker (--dist loadfile): its module fixtures are built once.
TEST_WORKERS ?= auto

test: lint
	$(BIN)/python -m compileall -q -j 0 $(COMPILED) >/dev/null
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile

test-slow: $(BIN)/.installed
	$(BIN)/python -m compileall -q -j 0 $(COMPILED) >/dev/null
	$(BIN)/python -m pytest -m slow

bench: $(BIN)/.installed
	$(BIN)/python bench/spool_drain.py

# The Dockerfile's image without Docker or a registry base image: mmdebstrap + umoci (Debian packages;
# root, or a user with /etc/subuid for mmdebstrap's unshare mode). docs/install.md.
image: $(BIN)/.installed
	PY=$(BIN)/python OUT=$(IMAGE_OUT) IMAGE=$(IMAGE) VERSION=$(VERSION) deploy/image/build.sh

# Pushes what `make image` built (skopeo: Debian's package; log in first with `skopeo login`).
image-push:
	skopeo copy oci:$(IMAGE_OUT)/oci:$(VERSION) docker://$(IMAGE):$(VERSION)

# The same image with Docker (BuildKit), both architectures, pushed.
docker-image:
	docker buildx build --platform linux/amd64,linux/arm64 --build-arg VERSION=$(VERSION) \
		--build-arg REVISION=$$(git rev-parse HEAD) --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
		-t $(IMAGE):$(VERSION) --push .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
