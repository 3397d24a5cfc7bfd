# The README's two promises: `make run` and `make test`, on a fresh Debian 12 as root
# (one that has only git and make: the first step installs Python itself).
# Debian's own interpreter, the one a Debian user gets (with Debian's patches and OpenSSL
# defaults), never whatever python3 PATH finds first; PYTHON=... chooses another.
PYTHON ?= /usr/bin/python3
VENV   := .venv
PY     := $(VENV)/bin/python
# Debian packages. APT_BOOT: Python with venv's pip bootstrap (Debian splits it into
# python3-venv) and what builds the compiled load engine (bench/fastloop.c, TLS by libssl).
# APT_RUN: the tools tailgate reads from. APT_TEST: the real servers/peers the tests use.
APT_BOOT := python3 python3-venv python3-dev gcc libc6-dev libssl-dev
APT_RUN  := ethtool iproute2 bpftrace
APT_TEST := $(APT_RUN) nginx-light wrk prometheus-node-exporter g++ cmake liburing-dev \
            numactl prometheus chromium openmpi-bin libopenmpi-dev dpdk-dev debootstrap systemd \
            musl-tools libjemalloc-dev libgoogle-perftools-dev libmimalloc-dev golang-go

.PHONY: run test check venv venv-test apt-boot apt-run apt-test tracefs lint bench clean \
        fresh-root-run fresh-root-test screenshots

# A venv counts only once pip works in it: a set-up that failed half way (no python3-venv,
# no space) is removed and made again by the next `make`, never left to break it.
$(VENV)/.venv-ok: | apt-boot
	@if [ -e $(VENV) ] && ! $(PY) -m pip --version >/dev/null 2>&1; then \
	  echo "removing $(VENV): an earlier set-up left it without pip"; rm -rf $(VENV); fi
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found: apt-get install python3"; exit 1; }
	@[ -e $(PY) ] || $(PYTHON) -m venv $(VENV) || { rm -rf $(VENV); \
	  echo "$(PYTHON) -m venv failed: on Debian, apt-get install python3-venv"; exit 1; }
	@$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV); \
	  echo "$(VENV) has no pip: on Debian, apt-get install python3-venv"; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	@touch $@

# tailgate, its runtime dependencies and the HTML pages' plotly (what `make run` needs)
# The compiled engine is optional for pip users without a compiler, never for `make run`,
# which installs one: a build that failed must not leave --engine auto on the slow engine.
$(VENV)/.installed-run: pyproject.toml | $(VENV)/.venv-ok apt-run
	$(PY) -m pip install -q -e '.[html]'
	@$(PY) -c "import tailgate.bench.fastloop" || { \
	  echo "the compiled load engine (bench/fastloop.c) did not build: gcc, python3-dev, libssl-dev"; \
	  exit 1; }
	touch $@

# plus what the tests need (pytest, hypothesis, ruff, the LLM test server, ...)
# (after apt-test: mpi4py builds against Open MPI, llama-cpp-python with cmake and g++)
$(VENV)/.installed-test: pyproject.toml | $(VENV)/.venv-ok apt-test
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-run

# llama.cpp's native server (llama-server, the C++ one) for the engine-phase tests
# (diagnose's engine records): built from the llama.cpp sources that llama-cpp-python's
# sdist vendors (the version the test extra installed; pip's cache usually holds it),
# the one target with its libraries linked in statically, no web UI, no TLS. About
# 25 minutes on two busy cores, once; the 77 MB sdist and the build tree are removed.
LLAMA_SERVER := $(VENV)/bin/llama-server
LLAMA_SRC    := $(VENV)/llama-server-src
$(LLAMA_SERVER): | $(VENV)/.installed-test
	@rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	v=$$($(PY) -c "import importlib.metadata as m; print(m.version('llama_cpp_python'))") && \
	$(PY) -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$$v" \
	  -d $(LLAMA_SRC) && \
	tar xzf $(LLAMA_SRC)/llama_cpp_python-$$v.tar.gz -C $(LLAMA_SRC) && \
	cmake -S $(LLAMA_SRC)/llama_cpp_python-$$v/vendor/llama.cpp -B $(LLAMA_SRC)/build \
	  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON \
	  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	  -DLLAMA_OPENSSL=OFF >$(LLAMA_SRC)/log 2>&1 && \
	nice -n 10 cmake --build $(LLAMA_SRC)/build --target llama-server -j$$(nproc) \
	  >>$(LLAMA_SRC)/log 2>&1 || { tail -30 $(LLAMA_SRC)/log; exit 1; }; \
	cp $(LLAMA_SRC)/build/bin/llama-server $@.tmp && mv $@.tmp $@
	rm -rf $(LLAMA_SRC)
	$@ --version

venv: $(VENV)/.installed-run
venv-test: $(VENV)/.installed-test $(LLAMA_SERVER)

# Debian packages, installed only when missing (needs root, as the README says). Explicit
# rules: GNU make never applies a pattern rule to a .PHONY target, so `apt-%` never ran.
APT_INSTALL = missing=""; for p in $(1); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "apt-get install$$missing"; \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

apt-boot:
	@$(call APT_INSTALL,$(APT_BOOT))

apt-run: apt-boot
	@$(call APT_INSTALL,$(APT_RUN))

apt-test: apt-boot
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

# The fast loop: lint plus the tests that need no root, server or network (under two minutes).
check: venv-test
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q -m unit

# The two promises proven on a brand-new Debian 12 root (debootstrap, chroot): `make run`
# runs in the suite (tests/test_fresh_root.py); `make test` there takes about half an hour,
# so it is run by hand before a release and when the Makefile or dependencies change.
fresh-root-run:
	tests/support/fresh_root.sh run
fresh-root-test:
	tests/support/fresh_root.sh test

# A PNG of every HTML page kind, from real runs, under build/screenshots/ (root: bpftrace).
screenshots: venv-test apt-test tracefs
	$(PY) tests/support/screenshots.py

bench: venv-test apt-test
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info report.json
