# probescope: `make demo` runs the main job on a built-in demo target, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the tests need (compilers for the test targets, <sys/sdt.h>, real programs:
# nginx, redis-server under redis-benchmark, and Go for a register-ABI target; trace-cmd to read
# recordings; perf as the reference for unwound stacks, chromium to render the SVG flame graph;
# python3-dev for the report accelerator's C extension when python3 is Debian's own).
TEST_PACKAGES := gcc g++ make binutils systemtap-sdt-dev xz-utils nginx golang-go trace-cmd \
	redis-server redis-tools linux-perf chromium python3-dev
# The QEMU test guest (tests/vm); its tests skip with a reason when these cannot be installed.
VM_PACKAGES := qemu-system-x86 busybox-static cpio
# Peers the benchmarks measure probescope against.
BENCH_PACKAGES := trace-cmd bpftrace ltrace linux-perf gdb uftrace bpfcc-tools

.PHONY: test demo lint bench test-vm venv system-deps bench-deps clean

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.stamp

define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:" $$missing; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing >/dev/null; \
	fi
endef

system-deps:
	$(call apt_install,$(TEST_PACKAGES))
	-$(call apt_install,$(VM_PACKAGES))

bench-deps: system-deps
	$(call apt_install,$(BENCH_PACKAGES))

test: system-deps venv
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy
	$(PY) -m pytest -q --durations=15

test-vm: system-deps venv
	$(call apt_install,$(VM_PACKAGES))
	PROBESCOPE_VM_REQUIRED=1 $(PY) -m pytest -q -m vm tests/vm

lint: venv
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/mypy

DEMO := demo/build/demo_loop
DEMO_PROBES := '$(DEMO):func_1' '$(DEMO):func_2 a=arg1:s32 b=arg2:s32' \
	'r:$(DEMO):func_2 ret=retval:s32' \
	'$(DEMO):greet name=+0(arg1):string x=+0(arg2):s32 y=+4(arg2):s32'

demo: system-deps venv
	$(MAKE) -s -C demo
	@echo "== the kernel definitions these probes resolve to"
	$(PY) -m probescope resolve $(DEMO_PROBES)
	@echo "== tracing the demo program"
	$(PY) -m probescope trace -c '$(DEMO) 5 100' $(DEMO_PROBES)

bench: bench-deps venv
	$(call apt_install,$(VM_PACKAGES))
	$(PY) bench/bench_symbols.py
	$(PY) bench/bench_demangle.py --install
	$(PY) bench/bench_tracefs.py
	$(PY) bench/bench_bpf.py
	$(PY) bench/bench_ptrace.py
	$(PY) bench/bench_static.py
	$(PY) bench/bench_fentry.py
	$(PY) bench/bench_record.py
	$(PY) bench/bench_report.py
	$(PY) bench/bench_aggregate.py

clean:
	rm -rf $(VENV) demo/build build src/*.egg-info .pytest_cache .ruff_cache .mypy_cache \
		src/probescope/traceevent/_fastformat*.so
