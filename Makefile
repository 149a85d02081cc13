# Everything a fresh machine needs comes from here: the virtual environment,
# the dependencies, an embedded PostgreSQL (when FENCEGATE_DATABASE_URL is unset)
# and the migrations.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

BENCH_STAMP := $(VENV)/.installed-bench
DEPLOY_STAMP := $(VENV)/.installed-deploy

.PHONY: run test lint chaos bench deploy-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/fencegate dev

test: $(STAMP)
	$(BIN)/python -m pytest -q tests

lint: $(STAMP)
	$(BIN)/ruff check leases gateway tests
	$(BIN)/mypy leases gateway

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $(BENCH_STAMP)

# the full fault-injection run (about 6 minutes here); writes docs/RELIABILITY.md.
# CHAOS_ARGS="--seed N" replays a run's fault schedule.
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run $(CHAOS_ARGS)

# writes bench/RESULTS.md; BENCH_SECONDS sets each timed phase (default 5)
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

$(DEPLOY_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,deploy]'
	touch $(DEPLOY_STAMP)

# validates everything in deploy/ with real tools, then scrapes a real gateway and
# worker with a real Prometheus through a zombie (about a minute; installs Debian's
# prometheus into .venv and docker-compose when missing). Not part of `make test`.
deploy-check: $(DEPLOY_STAMP)
	PATH="$$(deploy/check/tools.sh)" && export PATH && \
	$(BIN)/python deploy/check/static.py && \
	$(BIN)/python deploy/check/scrape.py

clean:
	rm -rf $(VENV) .fencegate
