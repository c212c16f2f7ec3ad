# Two commands do all the set-up on a fresh machine: `make test` and `make demo`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test e2e demo lint typecheck contracts template sam-validate unit integration node-deps image-deps agent-image agent-image-arm64 image-tests image-tests-arm64 lambda-layers bench mutate mutate-changed proto clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy layers/shared/python/prewarm agent/prewarm_agent cli/prewarm_cli devtools/prewarm_devtools
	@# Each handler is a module named `app`, so they are checked one at a time, against the layer's source.
	for f in functions/*/app.py; do MYPYPATH=layers/shared/python $(VENV)/bin/mypy "$$f" || exit 1; done

contracts: $(STAMP)
	$(VENV)/bin/lint-imports

template: $(STAMP)
	$(VENV)/bin/cfn-lint template.yaml

# aws-sam-cli lives in its own venv: its pins clash with the project's. Both checks run offline.
SAM_VENV := .venv-sam
$(SAM_VENV)/bin/sam:
	$(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/pip install -q 'aws-sam-cli>=1.170,<2'

sam-validate: $(SAM_VENV)/bin/sam
	SAM_CLI_TELEMETRY=0 $(SAM_VENV)/bin/sam validate --lint -t template.yaml
	SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=us-east-1 $(SAM_VENV)/bin/sam validate -t template.yaml

# Installs containerd and the registry for the node tests when running as root (see devtools/node-deps.sh):
# containerd 2.1 by default, PREWARM_CONTAINERD=1.7 or 1.6 for another.
node-deps:
	@bash devtools/node-deps.sh

# The node tier (a real containerd, and the agent against it) on another containerd than make test's 2.1:
# `make node-tier-1.7`, `make node-tier-1.6` (CI runs both after make test: .ci/run).
NODE_TIER := tests/integration/node tests/integration/agent
node-tier-%: $(STAMP)
	PREWARM_CONTAINERD=$* bash devtools/node-deps.sh
	PREWARM_CONTAINERD=$* $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(NODE_TIER); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no node tests" >&2; exit 1; fi; exit $$rc

# The agent image without a Docker daemon (devtools/prewarm_devtools/agent_image.py), as agent/Dockerfile
# says, on Debian trixie's Python 3.13 (the Dockerfile's python:3.13-slim):
# build/agent-image/prewarm-agent-<arch>.tar, an OCI archive tagged prewarm-agent:<version>. After the arm64
# image, build/agent-image/prewarm-agent.tar holds both in one multi-architecture OCI index, if the amd64
# image is there (make test builds it first).
image-deps:
	@bash devtools/image-deps.sh

AGENT_IMAGE_DIR := build/agent-image
agent-image: $(STAMP) image-deps
	$(PY) -m prewarm_devtools.agent_image --out $(AGENT_IMAGE_DIR)

agent-image-arm64: $(STAMP) image-deps
	$(PY) -m prewarm_devtools.agent_image --arch arm64 --index --out $(AGENT_IMAGE_DIR)

# The image tier runs what `agent-image` built: its settings against the Dockerfile, and a local stack
# whose agent is a container of it.
image-tests: agent-image node-deps
	PREWARM_AGENT_IMAGE_DIR=$(AGENT_IMAGE_DIR) $(PY) -m pytest -q -s tests/image; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no image tests" >&2; exit 1; fi; exit $$rc

# The arm64 image (Graviton nodes), built and checked under qemu-user-static, and the index of both
# (tests/image/test_agent_index.py, skipped while one is missing): slower, so CI runs it after make test
# (.ci/run) rather than make test itself.
image-tests-arm64: agent-image-arm64 node-deps
	PREWARM_AGENT_IMAGE_DIR=$(AGENT_IMAGE_DIR) PREWARM_AGENT_IMAGE_ARCH=arm64 $(PY) -m pytest -q -s tests/image; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no image tests" >&2; exit 1; fi; exit $$rc

# The deps layer as layers/deps/Makefile installs it, checked against template.yaml: compiled code only for
# the functions' architecture and Python, every function with its layers under Lambda's 250 MB unzipped.
# tests/integration/test_lambda_layers.py runs the same in make test.
LAMBDA_LAYERS_DIR := build/lambda-layers
lambda-layers: $(STAMP)
	rm -rf $(LAMBDA_LAYERS_DIR)
	$(PY) -m prewarm_devtools.lambda_layers --out $(LAMBDA_LAYERS_DIR)

unit: $(STAMP)
	$(PY) -m pytest tests/unit -q

# Mutation testing (prewarm_devtools/mutation.py, docs/performance.md): each domain module with the fast
# tests that cover it, a score per module, at least 95 % of the mutants that are not listed as equivalent
# (tests/mutation/equivalent.txt). Not part of make test. `make mutate MODULES="reports dispatch"` gives the
# services' baseline. CI runs mutate-changed: only the modules whose source or tests changed since
# tests/mutation/checked.txt, which make mutate rewrites when a module reaches its goal.
MUTATE_CHILDREN ?= 2
MODULES ?=
mutate: $(STAMP)
	$(PY) -m prewarm_devtools.mutation --max-children $(MUTATE_CHILDREN) $(MODULES)

mutate-changed: $(STAMP)
	$(PY) -m prewarm_devtools.mutation --changed --no-record --max-children $(MUTATE_CHILDREN) $(MODULES)

# Every tier but e2e on two workers, a test file per worker at a time (files share their servers), in
# collection order: tests/conftest.py puts the longest files first;
# then the e2e tier, each file a whole local stack: two at a time, but the `timed` tests (bounds of
# seconds on what a stack does) alone afterwards, on a machine no other stack is loading; then the
# agent image, built and run (image-tests).
PYTEST_WORKERS ?= 2
test: lint typecheck contracts template sam-validate node-deps
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/e2e --ignore=tests/image \
	  -m "not slow"; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc
	@# The figures of what users deploy, printed: each function's unzipped size with its layers, the
	@# deps layer's architecture check (tests/integration/test_lambda_layers.py asserts the same).
	$(MAKE) lambda-layers

# The slow tier, which CI runs after `make test` (.ci/run): first the `slow` tests outside tests/e2e (the
# benchmarks run at a tiny size, the crash-at-every-write and burst runs: minutes of CPU that make test
# leaves out to keep within 15 minutes); then each tests/e2e file runs a whole local stack,
# two files at a time, then the `timed` ones alone; then the agent image is built and run as the pod.
e2e: $(STAMP) node-deps
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --ignore=tests/e2e \
	  --ignore=tests/image -m slow; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no slow tests" >&2; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile -m "not timed" tests/e2e; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no e2e tests" >&2; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc; \
	  $(PY) -m pytest -q -m timed tests/e2e; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no timed e2e tests" >&2; exit 1; fi; [ $$rc -eq 0 ] || exit $$rc
	$(MAKE) image-tests

demo: $(STAMP) node-deps
	$(VENV)/bin/prewarm demo --nodes 3 --image-mb 50

bench: $(STAMP) node-deps
	@# Figures, machine and commands: docs/performance.md. Each benchmark's last line is one JSON object.
	$(PY) benchmarks/select_nodes.py --nodes 5000
	$(PY) benchmarks/fanout.py --nodes 5000 --parallelism 5000
	$(PY) benchmarks/cold_start.py
	$(PY) benchmarks/environments.py
	@# 4 and 5 need root, containerd and docker-registry (node-deps); they exit 2 naming what is missing.
	$(PY) benchmarks/agent_overhead.py --image-mb 200
	$(PY) benchmarks/e2e_latency.py --nodes 20
	$(PY) benchmarks/slot_refill.py --nodes 10 --parallelism 5 --image-mb 30
	$(PY) benchmarks/boot_warm.py --image-mb 1024 --layers 4
	$(PY) benchmarks/resource_sync.py --jobs 1000
	$(PY) benchmarks/sweep.py --nodes 5000 --images 50 --departed 1000
	$(PY) benchmarks/sweep.py --scenario jobs
	$(PY) benchmarks/capacity.py
	$(PY) benchmarks/registry_budget.py --nodes 5000 --layers 30

clean:
	rm -rf $(VENV) $(SAM_VENV) .pytest_cache .mypy_cache .ruff_cache build
