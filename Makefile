# ptscope developer entry points.  `make demo` and `make test` work from a clean clone:
# they install what is missing (Debian packages when run as root, then a venv).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := linux-perf qemu-user uftrace gcc g++ make lld rustc libiberty-dev
# A command that must exist for each package above (same order; a path: a file that must).
APT_COMMANDS := perf qemu-x86_64 uftrace gcc g++ make ld.lld rustc /usr/lib/x86_64-linux-gnu/libiberty.a
# Only the tests need these: a real browser for the flame graph SVG test, the OCaml and Go
# compilers for the corpus programs in those languages (rustc is in APT_PACKAGES: any
# rustc on PATH will do, rustup's too).
TEST_APT_PACKAGES := chromium ocaml-nox golang-go
TEST_APT_COMMANDS := chromium ocamlopt go
# Only the benchmarks need these: callgrind, the yardstick of bench/emulated.py.
BENCH_APT_PACKAGES := valgrind
BENCH_APT_COMMANDS := valgrind
PYTEST_ARGS ?=
# Test workers (pytest-xdist): one per core, at most 4. Each test file runs whole on one
# worker (--dist loadfile), so a module's fixtures are made once; build caches are shared
# and written atomically. JOBS=1 runs the suite in this process.
# The cores this process may use (affinity), fewer under a cgroup CPU quota (a container
# limited to 2 CPUs on a big host), at most 4.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); \
	read q p < /sys/fs/cgroup/cpu.max 2>/dev/null && [ "$$q" != max ] && \
	  [ $$(( q / p )) -lt $$n ] && n=$$(( q / p > 0 ? q / p : 1 )); \
	echo $$(( n < 4 ? n : 4 )))
PYTEST_PARALLEL = $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile)

.PHONY: help deps system-deps test-system-deps bench-system-deps venv demo test lint format unit bench fuzz fuzz-parsers clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

# $(call apt_install,COMMANDS,PACKAGES): install the packages whose command is missing
# (when root with apt-get; otherwise print the line to run).
define apt_install
	@missing=""; cmds=($(1)); pkgs=($(2)); \
	for i in "$${!cmds[@]}"; do c="$${cmds[$$i]}"; \
	  if [ "$${c#/}" != "$$c" ]; then [ -e "$$c" ]; else command -v "$$c" >/dev/null; fi || missing="$$missing $${pkgs[$$i]}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing:$$missing"; \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null || \
	      { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing >/dev/null; }; \
	  else echo "missing system packages:$$missing (install them with: sudo apt-get install$$missing)"; fi; \
	fi
endef

system-deps: ## install missing Debian packages (perf, qemu-user, uftrace, compilers, lld, rustc, libiberty) when root
	$(call apt_install,$(APT_COMMANDS),$(APT_PACKAGES))

test-system-deps: ## install what only the tests need (chromium, ocaml-nox, golang-go) when root
	$(call apt_install,$(TEST_APT_COMMANDS),$(TEST_APT_PACKAGES))

bench-system-deps: ## install what only the benchmarks need (valgrind) when root
	$(call apt_install,$(BENCH_APT_COMMANDS),$(BENCH_APT_PACKAGES))

$(STAMP): pyproject.toml setup.py $(wildcard src/ptscope/*.c src/ptscope/_native/*.c src/ptscope/_native/*.h src/ptscope/reconstruct/*.c src/ptscope/decode/*.c src/ptscope/record/emulated/plugin/*.[ch])
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[test]'
	@touch $@

venv: $(STAMP) ## create .venv with ptscope (editable) and the test tools

deps: system-deps venv

demo: deps ## record and decode the bundled demo program into demo.fxt.gz
	$(BIN)/ptscope demo

lint: venv ## ruff check, ruff format --check, mypy --strict src/
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy --strict src/

format: venv ## apply ruff format and autofixes
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

unit: deps test-system-deps ## the test suite without lint (JOBS=N workers)
	$(BIN)/pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

test: deps test-system-deps lint ## lint + the whole test suite (JOBS=N workers)
	$(BIN)/pytest -q $(PYTEST_PARALLEL) $(PYTEST_ARGS)

N ?= 500
fuzz: deps ## generated programs vs every oracle: make fuzz N=500 (prints K/N identical)
	$(BIN)/python tests/fidelity/fuzz.py -n $(N)

fuzz-parsers: deps ## every parser on N damaged inputs: make fuzz-parsers N=100000 (exit 1 on a bug)
	$(BIN)/python tests/fuzz/campaign.py -n $(if $(filter command line environment,$(origin N)),$(N),100000)

bench: deps bench-system-deps ## run the benchmarks in bench/
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean: ## remove the venv and build outputs
	rm -rf $(VENV) build src/*.egg-info tests/.build .pytest_cache .mypy_cache .ruff_cache
	find src -name '*.so' -delete
