# Sluice: make demo | make demo-check | make test | make soak | make bench [B=name] | make lint
# Every target creates .venv and installs what it needs on first use; the
# second time the stamp files make it a quick no-op.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.sluice-installed
JARS   := $(VENV)/.sluice-jars
REDIS  := $(VENV)/.sluice-redis
CHROMIUM := $(VENV)/.sluice-chromium
COMPOSE := $(VENV)/.sluice-compose
VERSITYGW := $(VENV)/.sluice-versitygw
POSTGRES := $(VENV)/.sluice-postgres
NATS   := $(VENV)/.sluice-nats
TOXIPROXY := $(VENV)/.sluice-toxiproxy
B      ?=
PYTEST_ARGS ?=

.PHONY: demo demo-check test soak bench lint install clean spark test-unit-py

# pip runs quietly: one line says what each silent step does and that it takes a while.
$(STAMP): pyproject.toml constraints.txt
	@bash scripts/ensure-venv.sh $(PYTHON) $(VENV)
	@echo "sluice: pip install of Sluice with every extra (.[all,dev]) at the tested versions (constraints.txt): Spark, Airflow, dev tools into $(VENV) (quiet, 1-3 min the first time)"
	@$(PY) -m pip install -q --upgrade pip
	@# PYTHONWARNINGS: no setuptools banner about editable installs (a warning, not an error)
	@PYTHONWARNINGS=ignore $(PY) -m pip install -q -c constraints.txt -e '.[all,dev]'
	@touch $@

# Resolve the Delta jars from Maven Central once (Spark's own resolver caches them under
# ~/.ivy2*) and record their paths: local sessions then pass them as spark.jars, no Ivy.
$(JARS): $(STAMP)
	@echo "sluice: fetching the Delta jars from Maven Central (once, up to a minute)"
	@# Spark and Ivy print ~80 lines: kept in a log, shown only if the step fails
	@$(PY) -m pipeline.lake.spark.session --warm > $(VENV)/warm-jars.log 2>&1 || { cat $(VENV)/warm-jars.log; exit 1; }
	@grep '^sluice:' $(VENV)/warm-jars.log || true
	@touch $@

$(REDIS):
	@bash scripts/ensure-redis.sh
	@mkdir -p $(VENV) && touch $@

# Debian's chromium for the status page test (skipped with a reason when missing).
$(CHROMIUM):
	@bash scripts/ensure-chromium.sh
	@mkdir -p $(VENV) && touch $@

# a Compose implementation for `config` checks of docker/compose.yaml (no engine needed)
$(COMPOSE):
	@bash scripts/ensure-compose.sh
	@mkdir -p $(VENV) && touch $@

# versitygw, the S3 server of the object-store lake tests (built once from the Go module
# proxy into ~/.cache/sluice-versitygw/<version>, ~15 min the first time).
$(VERSITYGW):
	@bash scripts/ensure-versitygw.sh
	@mkdir -p $(VENV) && touch $@

# toxiproxy-server, the network-fault proxy of the nemesis tests (built once from the Go
# module proxy into ~/.cache/sluice-toxiproxy/<version>, well under a minute the first time).
$(TOXIPROXY):
	@bash scripts/ensure-toxiproxy.sh
	@mkdir -p $(VENV) && touch $@

# Debian's PostgreSQL: Airflow's metadata database in the real-scheduler tests (and the demo).
$(POSTGRES):
	@bash scripts/ensure-postgres.sh
	@mkdir -p $(VENV) && touch $@

install: $(STAMP) $(JARS) $(REDIS) $(CHROMIUM) $(COMPOSE) $(VERSITYGW) $(POSTGRES) $(TOXIPROXY)

demo: install
	$(VENV)/bin/sluice demo

# the whole system as a scripted scenario (exit 0 only if every check passed); CI runs it
demo-check: install
	$(VENV)/bin/sluice demo --check

# The suite in TEST_WORKERS processes (pytest-xdist; a test file stays in one worker, with its
# fixtures): its time is mostly waiting on real servers, so two take about two thirds of it
# even on two cores.
# TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= 2
test: install
	PYTHONASYNCIODEBUG=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The long scenarios `make test` leaves out (tests marked soak: the whole demo check on a
# Redis Cluster, serve under a 20 s attack), then the history checkers (tests/history,
# docs/history-checker.md) over many seeds: make soak [SEEDS=200] [STEPS=12]; about
# 20-40 s a seed. A failure prints its replay command; serve logs at DEBUG in the seed's
# directory (the failures left open pass when replayed: the log of the run that failed is
# the evidence). SERVE_LOG=WARNING for quieter logs.
SEEDS ?= 200
STEPS ?= 12
SERVE_LOG ?= DEBUG
soak: install
	PYTHONASYNCIODEBUG=1 $(PY) -m pytest -m soak $(PYTEST_ARGS)
	CHECKER_SEEDS=$(SEEDS) CHECKER_STEPS=$(STEPS) CHECKER_SERVE_LOG=$(SERVE_LOG) $(PY) -m pytest tests/history $(PYTEST_ARGS)

# The unit suite on another Python: make test-unit-py PYV=3.12 (or 3.13). Its own venv,
# .venv-py$(PYV), from pyenv's python$(PYV) or the one on PATH; not part of `make test`.
PYV ?= 3.12
OTHER_PY = $(firstword $(wildcard $(HOME)/.pyenv/versions/$(PYV).*/bin/python$(PYV)) \
	$(shell command -v python$(PYV)))
OTHER_VENV := .venv-py$(PYV)

test-unit-py: $(REDIS)
	@test -n "$(OTHER_PY)" || { echo "sluice: no python$(PYV) (pyenv or PATH)"; exit 2; }
	@bash scripts/ensure-venv.sh $(OTHER_PY) $(OTHER_VENV)
	@test $(OTHER_VENV)/.sluice-installed -nt pyproject.toml -a \
		$(OTHER_VENV)/.sluice-installed -nt constraints.txt || { \
		echo "sluice: pip install of .[all,dev] into $(OTHER_VENV) (quiet, minutes the first time)"; \
		PYTHONWARNINGS=ignore $(OTHER_VENV)/bin/python -m pip install -q -c constraints.txt -e '.[all,dev]' && \
		touch $(OTHER_VENV)/.sluice-installed; }
	PYTHONASYNCIODEBUG=1 $(OTHER_VENV)/bin/python -m pytest tests/unit $(PYTEST_ARGS)

# A local Spark Connect server for the lake jobs (export SLUICE_SPARK_REMOTE=<printed URL>).
spark: install
	$(VENV)/bin/sluice spark

# Bench only (not part of install: `make test` needs no NATS): nats-server, built once from
# the Go module proxy into ~/.cache/sluice-nats/<version>, and nats-py (the `bench` extra),
# the NATS core request-reply baseline of B=bus.
$(NATS): $(STAMP)
	@bash scripts/ensure-nats.sh $(PY)
	@touch $@

bench: install $(NATS)
	$(PY) tests/bench/run.py $(B)

lint: $(STAMP)
	$(VENV)/bin/ruff check pipeline dags plugins tests
	$(VENV)/bin/ruff format --check pipeline dags plugins tests
	$(VENV)/bin/mypy pipeline dags plugins
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	rm -rf var bench-results
