# gpufleet developer entry points. Run as root on a Debian 12 build machine.
#   make run    build the lab and provision it with site.yml
#   make test   build the lab and run every test (lint, unit, payload, molecule, end-to-end)
#   make verify re-verify the lab nodes (read-only; report in reports/verify)
#   make bench  provisioning benchmark on the lab (figures only; about an hour)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
LAB_NODES ?= 3
export CONTAINERS_CONF := $(CURDIR)/files/lab/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)

.PHONY: run verify bench lab lab-destroy lab-clean host-deps venv torch lint unit payload molecule e2e test

run: lab
	$(BIN)/ansible-playbook site.yml -i inventory/lab

verify: venv
	$(BIN)/python files/gpufleet_verify.py -i inventory/lab

# Figures, not tests: converge/re-run/verify times for 1, 3 and 6 nodes, the
# by-hand shell sequence, payload samples/s (BENCH_ARGS="--sizes 1 --skip-shell").
bench: lab torch
	$(BIN)/python tests/bench/provisioning.py $(BENCH_ARGS)

host-deps:
	@missing=""; for t in podman:podman runc:runc debootstrap:debootstrap apt-ftparchive:apt-utils gpg:gnupg; do \
	  command -v $${t%%:*} >/dev/null || missing="$$missing $${t##*:}"; done; \
	python3 -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi

venv: $(VENV)/.installed
$(VENV)/.installed: requirements/dev.txt | host-deps
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements/dev.txt
	touch $@

lab: host-deps venv
	$(BIN)/ansible-playbook playbooks/lab.yml -e lab_nodes=$(LAB_NODES)

lab-destroy: venv
	$(BIN)/ansible-playbook playbooks/lab-destroy.yml

lab-clean: lab-destroy
	rm -rf .lab .cache

lint: venv
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production
	$(BIN)/python tests/check_argument_specs.py

unit: venv
	$(BIN)/pytest -q tests/unit

molecule: lab
	$(BIN)/molecule -c molecule/shared/base.yml test --all

e2e: lab
	$(BIN)/pytest -q tests/e2e

# The payload and the health checks on CPU (torchrun, gloo) need torch in
# the venv: the CPU wheel of the lab's release (requirements/dev.txt leaves
# it out, so that linting needs no 200 MB wheel).
torch: $(VENV)/.torch
$(VENV)/.torch: | venv
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	touch $@

payload: torch
	$(BIN)/pytest -q tests/payload

test: lint unit payload molecule e2e
