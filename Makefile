# ragpulse: two commands do all the set-up.
#   make run   create .venv if missing, install, judge the bundled sample events (no key, no server)
#   make test  same set-up, plus the system packages the tests need, then ruff, mypy and pytest
#   make test-fast  the same without the tests marked slow (broker, serve, Prometheus, Beam runs)

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SYSTEM_BINARIES := prometheus promtool amtool prometheus-alertmanager prometheus-pushgateway stunnel4
SYSTEM_PACKAGES := prometheus prometheus-alertmanager prometheus-pushgateway stunnel4

.PHONY: run test test-fast lint typecheck pytest pytest-fast system-deps bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ragpulse run deploy/samples/events.jsonl --output out/ --judge-backend local

system-deps:
	@missing=""; for b in $(SYSTEM_BINARIES); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing system packages for the tests: $(SYSTEM_PACKAGES)"; \
	    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(SYSTEM_PACKAGES) || exit 1; \
	  else \
	    echo "missing:$$missing. Install the Debian packages $(SYSTEM_PACKAGES) (as root: apt-get install -y $(SYSTEM_PACKAGES)) and run make test again." >&2; \
	    exit 1; \
	  fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) system-deps
	$(BIN)/pytest

test: lint typecheck pytest

pytest-fast: $(STAMP) system-deps
	$(BIN)/pytest -m "not slow"

test-fast: lint typecheck pytest-fast

clean:
	rm -rf out .mypy_cache .ruff_cache .pytest_cache
