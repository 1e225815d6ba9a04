# gpufleet developer entry points. Run as root on a Debian 12 build machine.
#   make run    build the lab and provision it with site.yml
#   make test   build the lab and run every test (lint, unit, payload, molecule, end-to-end),
#               stage by stage, with a stage-time table at the end (tools/stages.py;
#               reports/ci-stages.md)
#   make test-slow  the slow tier (docs/testing.md), not in make test
#   make test-scale verify on 20 light lab nodes alone (docs/testing.md; a stage of make test too)
#   make verify re-verify the lab nodes (read-only; report in reports/verify)
#   make bench  provisioning and scale benchmarks on the lab (figures only; about 45 min);
#               make bench QUICK=1: the scale benchmark alone (light nodes, about 15 min)
#   make ee     the execution environment image for AWX / AAP job templates (docs/scale.md)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
# LAB_NODES=<n> make lab: another number of lab GPU nodes (tests/lab/vars/lab.yml).
LAB_NODES ?=
export CONTAINERS_CONF := $(CURDIR)/tests/lab/files/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)
# The lab's download cache, outside the clone (tests/lab/files/lab_cache.py).
GPUFLEET_LAB_CACHE ?= /var/cache/gpufleet-lab
export GPUFLEET_LAB_CACHE

.PHONY: run verify bench lab lab-destroy lab-clean cache-clean host-deps venv torch lint unit payload payload-build molecule e2e test test-slow test-scale docs ee-collection ee-context ee

run: lab
	$(BIN)/ansible-playbook site.yml -i tests/lab/inventory

verify: venv
	$(BIN)/python files/gpufleet_verify.py -i tests/lab/inventory

# Figures, not tests: converge/re-run/verify times for 1 and 3 nodes, the
# by-hand shell sequence, payload samples/s (BENCH_ARGS="--sizes 1 --skip-shell"),
# then verify.yml and play 1 on 1, 10, 50 and 100 light nodes (tools/bench/scale.py;
# SCALE_ARGS="--sizes 1,10"). QUICK=1: the scale benchmark alone.
QUICK ?=
bench: lab torch
	$(if $(QUICK),,$(BIN)/python tools/bench/provisioning.py $(BENCH_ARGS))
	$(BIN)/python tools/bench/scale.py $(SCALE_ARGS)

host-deps:
	@missing=""; for t in podman:podman runc:runc debootstrap:debootstrap apt-ftparchive:apt-utils gpg:gnupg; do \
	  command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

# The clone as the collection gpufleet.fleet (ansible.cfg collections_path).
COLLECTION_LINK := .ansible/collections/ansible_collections/gpufleet/fleet

venv: $(VENV)/.installed $(COLLECTION_LINK)
$(COLLECTION_LINK):
	mkdir -p $(dir $@)
	ln -sfn ../../../.. $@
$(VENV)/.installed: requirements/dev.txt | host-deps
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements/dev.txt
	touch $@

lab: host-deps venv
	$(BIN)/ansible-playbook tests/lab/lab.yml $(if $(LAB_NODES),-e lab_nodes=$(LAB_NODES))

lab-destroy: venv
	$(BIN)/ansible-playbook tests/lab/lab-destroy.yml

# Removes the lab's state in the clone; the download cache stays.
lab-clean: lab-destroy
	rm -rf .lab .cache

# Empties the download cache: the next `make lab` downloads everything again.
cache-clean:
	rm -rf "$(GPUFLEET_LAB_CACHE)"

# ruff's lint and format check of every Python file (pyproject.toml; `ruff format .` formats),
# then ansible-test sanity on a copy of the working tree (tools/sanity.py; its per-test venvs
# are kept in .cache/ansible-test, the first run builds them from PyPI).
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production
	$(BIN)/python tools/check_argument_specs.py
	$(BIN)/python tools/sanity.py

unit: venv
	$(BIN)/pytest -q -n 2 tests/unit

molecule: lab
	$(BIN)/python tools/stages.py --only molecule

# The e2e converge (test_site.py) first, then the other modules.
e2e: lab
	$(BIN)/python tools/stages.py --only e2e

# The payload and the health checks on CPU (torchrun, gloo) need torch in
# the controller's venv: a CPU wheel (requirements/dev.txt leaves it out, so
# that linting needs no 200 MB wheel). The lab's nodes get the product's
# stack instead: PyPI's cu121 build of torch 2.3.1 (tests/lab/vars/lab.yml).
torch: $(VENV)/.torch
$(VENV)/.torch: | venv
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	touch $@

payload: torch
	$(BIN)/pytest -q tests/payload

# roles/payload/files/gpufleet_check.pyz, the one file a node receives, rebuilt from
# the package roles/payload/files/gpufleet_check/ (byte-identical for the same
# sources; commit both). tools/build_pyz.py --check compares them.
payload-build:
	python3 tools/build_pyz.py

# docs/roles.md, the role reference, from roles/*/meta/argument_specs.yml (tools/role_reference.py).
docs: venv
	$(BIN)/python tools/role_reference.py

# The execution environment (execution-environment.yml; docs/scale.md): the
# collection tarball built from this clone into ee/, then ansible-builder.
# ee-context writes the build context only; ee builds the image (podman or
# EE_RUNTIME=docker; the base image and the collections are fetched then).
EE_RUNTIME ?= podman
EE_TAG ?= gpufleet-ee:$(shell sed -n 's/^version: *//p' galaxy.yml)
EE_CONTEXT := .cache/ee/context
ee-collection: venv
	rm -rf .cache/ee/collection
	$(BIN)/ansible-galaxy collection build --output-path .cache/ee/collection .
	cp .cache/ee/collection/gpufleet-fleet-*.tar.gz ee/gpufleet-fleet.tar.gz

ee-context: ee-collection
	$(BIN)/ansible-builder create --file execution-environment.yml --context $(EE_CONTEXT)

ee: ee-collection
	$(BIN)/ansible-builder build --file execution-environment.yml --context $(EE_CONTEXT) \
	  --container-runtime $(EE_RUNTIME) --tag $(EE_TAG)

# Stage by stage, each timed: lint, unit, payload, lab, each molecule
# scenario, the e2e converge, the other e2e modules; the first failure stops.
test: venv
	$(BIN)/python tools/stages.py

# Verify on 20 light nodes, two forged to fail and one stopped (tests/e2e/test_scale.py; needs the
# lab, not its converge; under a minute), alone: make test runs it as the stage "e2e scale".
test-scale: lab
	$(BIN)/pytest -q -p no:cacheprovider tests/e2e/test_scale.py

# The slow tier (docs/testing.md): the lab, the e2e converge, then the e2e
# tests marked slow (install faults, the driver rollout, unreachable hosts).
# Not in make test; run before resolving an issue that touches what they cover.
test-slow: venv
	$(BIN)/python tools/stages.py --tier slow

