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

# plus what the tests need (pytest, hypothesis, ruff, the LLM test servers, ...)
# (after apt-test: mpi4py builds against Open MPI; llama.cpp, below, with cmake and g++)
$(VENV)/.installed-test: pyproject.toml $(VENV)/.installed-llama | $(VENV)/.venv-ok apt-test
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-run

# llama.cpp, compiled once for both LLM servers the tests run: from the sources that
# llama-cpp-python's sdist vendors, shared libraries plus llama-server (the C++ server, for
# diagnose's engine records); then llama-cpp-python (its OpenAI server) installed from that
# sdist without its own copy (LLAMA_BUILD=OFF), the libraries copied where it loads them.
# pip would otherwise compile the same sources a second time. About 10-25 minutes on two
# cores, once; the 77 MB sdist and the build tree are removed. RPATH $$ORIGIN: the libraries
# find each other beside them, and llama-server finds them from the venv's bin.
LLAMA_SERVER := $(VENV)/bin/llama-server
LLAMA_SRC    := $(VENV)/llama-src
$(VENV)/.installed-llama: | $(VENV)/.venv-ok apt-test
	@rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	$(PY) -m pip download -q --no-deps --no-binary :all: 'llama-cpp-python>=0.3' -d $(LLAMA_SRC)
	sdist=$$(ls $(LLAMA_SRC)/llama_cpp_python-*.tar.gz) && tar xzf $$sdist -C $(LLAMA_SRC) && \
	lib=$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/llama_cpp/lib && \
	rel=$$($(PY) -c "import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))" \
	  $$lib $(VENV)/bin) && \
	cmake -S $$(ls -d $(LLAMA_SRC)/llama_cpp_python-*/)vendor/llama.cpp -B $(LLAMA_SRC)/build \
	  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
	  "-DCMAKE_INSTALL_RPATH=\$$ORIGIN;\$$ORIGIN/$$rel" -DLLAMA_BUILD_SERVER=ON \
	  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	  -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
	  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >$(LLAMA_SRC)/log 2>&1 && \
	nice -n 10 cmake --build $(LLAMA_SRC)/build --target llama-server mtmd -j$$(nproc) \
	  >>$(LLAMA_SRC)/log 2>&1 || { tail -30 $(LLAMA_SRC)/log; exit 1; }; \
	CMAKE_ARGS="-DLLAMA_BUILD=OFF -DLLAVA_BUILD=OFF" $(PY) -m pip install -q --no-deps \
	  $$sdist && \
	$(PY) -m pip install -q "llama-cpp-python[server]" && \
	mkdir -p $$lib && cp -a $(LLAMA_SRC)/build/bin/*.so* $$lib/ && \
	cp $(LLAMA_SRC)/build/bin/llama-server $(LLAMA_SERVER)
	rm -rf $(LLAMA_SRC)
	$(LLAMA_SERVER) --version
	$(PY) -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__, 'on', llama_cpp.llama_cpp._lib._name)"
	touch $@

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
