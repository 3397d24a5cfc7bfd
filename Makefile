# The README's two promises: `make run` and `make test`, on a fresh Debian 12 as root.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Debian packages: the tools tailgate reads from and the real servers/peers the tests use.
APT_RUN  := ethtool iproute2 bpftrace
APT_TEST := $(APT_RUN) nginx-light wrk prometheus-node-exporter gcc g++ cmake libc6-dev liburing-dev \
            numactl prometheus chromium openmpi-bin libopenmpi-dev dpdk-dev \
            musl-tools libjemalloc-dev libgoogle-perftools-dev libmimalloc-dev golang-go python3-dev

.PHONY: run test venv venv-test apt-run apt-test tracefs lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# tailgate and its runtime dependencies (what `make run` needs)
$(VENV)/.installed-run: pyproject.toml | $(PY) apt-run
	$(PY) -m pip install -q -e .
	touch $@

# plus what the tests need (pytest, hypothesis, ruff, the LLM test server, ...)
# (after apt-test: mpi4py builds against Open MPI, llama-cpp-python with cmake and g++)
$(VENV)/.installed-test: pyproject.toml | $(PY) apt-test
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-run

venv: $(VENV)/.installed-run
venv-test: $(VENV)/.installed-test

# Debian packages, installed only when missing (needs root, as the README says). Explicit
# rules: GNU make never applies a pattern rule to a .PHONY target, so `apt-%` never ran.
APT_INSTALL = missing=""; for p in $(1); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install$$missing"; \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

apt-run:
	@$(call APT_INSTALL,$(APT_RUN))

apt-test:
	@$(call APT_INSTALL,$(APT_TEST))

# bpftrace needs tracefs; a freshly booted VM has it unmounted. Mounting it changes no
# setting of the host (tailgate itself stays read-only).
tracefs:
	@mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing || \
	  echo "tracefs could not be mounted: eBPF probes will report unknown"

# Inspect this host: pyramid report on the terminal, JSON in report.json.
# Exit status 1 (a red line crossed) is a result, not a failure of `make run`.
# As root with bpftrace, a short probe window measures the run-queue P999 (l2.sched.runqlat)
# and the other probed red lines; otherwise the report says which stayed unmeasured and why.
PROBE_WINDOW ?= 3
run: apt-run venv tracefs
	@window=""; if [ "$$(id -u)" = 0 ] && command -v bpftrace >/dev/null; then \
	  window="--probe-window $(PROBE_WINDOW)"; fi; \
	echo "tailgate inspect $$window --json report.json"; \
	$(VENV)/bin/tailgate inspect $$window --json report.json; rc=$$?; [ $$rc -le 1 ]

lint: venv-test
	$(VENV)/bin/ruff check src tests benchmarks

test: apt-test venv-test tracefs lint
	$(PY) -m pytest

bench: venv-test apt-test
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info report.json
