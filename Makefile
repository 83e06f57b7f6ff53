# The README's two commands. Both install whatever is missing, then run.
#   make demo   - the main job on examples/fleet (embedded PostgreSQL, no setup by hand)
#   make test   - lint, types, layer contract and the whole test suite
# Idempotent: a second run skips apt and pip unless a pyproject.toml changed.
# deps installs the product with its host drivers (.[dev,host]) and, beside it, the tools (tools/:
# gpuaas bench, gpuaas demo, the labs), which the product finds through entry points.

SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -c
VENV  := .venv
BIN   := $(VENV)/bin
STAMP := $(VENV)/.installed
# Recorded host sysfs trees (discovery and the host demo read them); build.py is their source.
SYSFS := examples/sysfs/.built
IRONIC_VENV := $(VENV)/ironic
IRONIC := $(IRONIC_VENV)/bin/ironic
# This machine's pip.conf names local mirrors that may be absent; their warnings are noise.
QUIET_PIP := { grep -v '^WARNING: Location' || true; }
# Debian packages the product and its tests drive for real
# (linux-image-amd64: the kernel the end-to-end test boots under qemu TCG).
APT_PACKAGES := python3 python3-venv python3-dev gcc pkg-config git \
	libvirt-dev libvirt-daemon-system qemu-system-x86 qemu-utils genisoimage \
	postgresql postgresql-contrib \
	dnsmasq-base dnsmasq-utils udhcpc iproute2 iptables openvswitch-switch linux-image-amd64 \
	util-linux e2fsprogs kmod busybox-static cpio chromium systemd prometheus libxml2-utils \
	fish zsh

.PHONY: demo test deps apt lint clean

demo: deps
	$(BIN)/gpuaas demo examples/fleet

# Two workers: the suite mostly waits on PostgreSQL, git, dnsmasq and Ironic, so two interleave well on 2 cores
# (beside another job: 597 s in one process, 390 s in two; a clean-clone .ci/run: 337 s, pytest 275 s); each test's resources are its own
# (names from the pid, temp dirs, a fresh database on its worker's server).
test: deps lint
	$(BIN)/pytest -q -n 2

lint: deps
	$(BIN)/ruff check desired policies reconciler host_reconciler schemas tools tests
	$(BIN)/ruff format --check desired policies reconciler host_reconciler schemas tools tests
	$(BIN)/mypy
	$(BIN)/lint-imports

deps: $(STAMP) $(SYSFS) $(IRONIC)

# A standalone Ironic (fake-hardware) in its own venv: baremetal tests and the demo drive it for real.
$(IRONIC):
	@test -x $(IRONIC_VENV)/bin/python || python3 -m venv $(IRONIC_VENV)
	$(IRONIC_VENV)/bin/pip install -q ironic 2>&1 | $(QUIET_PIP)
	@test -x $@

$(SYSFS): examples/sysfs/build.py $(STAMP)
	$(BIN)/python examples/sysfs/build.py
	@touch $@

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing: $$missing"; \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get update -qq && apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(STAMP): pyproject.toml tools/pyproject.toml
	@$(MAKE) --no-print-directory apt
	@test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q -e '.[dev,host]' 2>&1 | $(QUIET_PIP)
	$(BIN)/pip install -q --no-deps -e tools 2>&1 | $(QUIET_PIP)
	@touch $(STAMP)

clean:
	rm -rf $(VENV) .gpuaas .mypy_cache .ruff_cache .pytest_cache
