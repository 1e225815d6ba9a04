# gpufleet developer entry points. Run as root on a Debian 12 build machine.
#   make run    build the lab and provision it with site.yml
#   make test   build the lab and run every test (lint, unit, molecule, end-to-end)
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
VENV := $(CURDIR)/.venv
BIN := $(VENV)/bin
LAB_NODES ?= 3
export CONTAINERS_CONF := $(CURDIR)/files/lab/containers.conf
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(BIN):$(PATH)

.PHONY: run lab lab-destroy lab-clean host-deps venv lint unit molecule e2e test payload-test

run: lab
	$(BIN)/ansible-playbook site.yml -i inventory/lab

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

test: lint unit molecule e2e

# The DDP payload on CPU (torchrun, gloo). Work in progress for the
# verification plays: not yet part of `make test`.
payload-test: venv
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pytest -q tests/payload
