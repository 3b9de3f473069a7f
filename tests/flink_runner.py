"""Beam's Flink runner on loopback, for `ragpulse stream`: the Java services from the jars that
`make stream-tools` resolves with Maven (.ci/tools/beam/pom.xml) into
${RAGPULSE_CACHE:-.cache}/beam-VERSION/lib, and a Python SDK worker pool.

    def test_x(flink: FlinkServices) -> None:
        ragpulse("stream", ..., *flink.stream_args)

Three processes, each in its own session and stopped by its id:
- Beam's expansion service with ragpulse's Kafka read (java/kafka-read) on its classpath, run
  with deploy/flink's flags (the legacy read: `--experiments=use_deprecated_read`) but the
  EMBEDDED environment: the Java SDK harness runs inside the Flink JVM, so no Docker is needed.
- Beam's Flink job server (`FlinkJobServerDriver --flink-master=[local]`): an embedded Flink
  mini cluster that runs the submitted jobs.
- Beam's Python worker pool (tests/beam_services.py), which runs the Python stages of the job
  (`--environment_type=EXTERNAL`), as the worker pool sidecar does in deploy/flink.

The job server's gRPC ports bind every interface (Beam's ServerFactory ignores --job-host for
the bind address, it only uses it to advertise); the tests use them through 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import apache_beam
import pytest
from beam_services import service, worker_pool_command
from processes import free_port

REPO = Path(__file__).resolve().parent.parent
EXPANSION_SERVICE = "org.apache.beam.sdk.expansion.service.ExpansionService"
FLINK_JOB_SERVER = "org.apache.beam.runners.flink.FlinkJobServerDriver"


def beam_tools_dir() -> Path:
    """Where `make stream-tools` puts Beam's jars (lib/) and Prism (bin/) for the pinned Beam."""
    cache = Path(os.environ.get("RAGPULSE_CACHE") or REPO / ".cache")
    return cache / f"beam-{apache_beam.__version__}"


KAFKA_READ_SOURCES = REPO / "java" / "kafka-read"


def kafka_read_jar() -> Path:
    """ragpulse's Kafka read (java/kafka-read), where `make kafka-read-jar` builds it: a folder
    named after the hash of its sources (the Makefile's KAFKA_READ_DIR), so a stale jar is never
    used; fails the test when it was not built."""
    names = sorted(
        str(p.relative_to(REPO)) for p in KAFKA_READ_SOURCES.rglob("*")
        if p.is_file() and "target" not in p.relative_to(KAFKA_READ_SOURCES).parts
    )
    digest = hashlib.sha256(b"".join((REPO / n).read_bytes() for n in names)).hexdigest()
    jar = beam_tools_dir() / f"ragpulse-kafka-read-{digest[:16]}" / "ragpulse-kafka-read.jar"
    if not jar.is_file():
        pytest.fail(
            f"ragpulse's Kafka read is not built for these sources ({jar}): run "
            "`make kafka-read-jar` (Maven builds java/kafka-read into the cache)",
            pytrace=False,
        )
    return jar


def beam_classpath() -> str:
    """The Java classpath of the job server, the expansion service and Flink's processes:
    ragpulse's Kafka read, then Beam's jars. The legacy read runs inside Flink, so its timestamp
    policy must load there too, and the read's jar comes first so that its copy of Beam's
    Flink source wrapper (no final watermark on a stop with savepoint, java/kafka-read) is the
    one loaded. Fails the test (it does not skip) when they were not built."""
    lib = beam_tools_dir() / "lib"
    if not (lib / ".complete").is_file():
        pytest.fail(
            f"Beam's Java jars are not in {lib}: run `make stream-tools` (Maven resolves "
            ".ci/tools/beam/pom.xml into the cache)",
            pytrace=False,
        )
    return f"{kafka_read_jar()}:{lib}/*"


def expansion_service_args(port: int) -> list[str]:
    """The expansion service's flags as deploy/flink/jobserver.yaml runs them (its read and
    experiments), with the EMBEDDED environment (tests/flink_cluster.py)."""
    from flink_cluster import local_expansion_args  # it imports this module

    return local_expansion_args(port)


# Flink's Kryo serializer reaches into JDK internals: on Java 17 these packages must be opened
# (the list of Flink 1.19's env.java.opts.all for Java 17).
JAVA_17_OPENS = [
    f"--add-opens=java.base/{package}=ALL-UNNAMED"
    for package in (
        "java.lang", "java.lang.reflect", "java.io", "java.net", "java.nio", "java.text",
        "java.time", "java.util", "java.util.concurrent", "java.util.concurrent.atomic",
        "java.util.concurrent.locks", "sun.nio.ch",
    )
]


# A test's JVMs run for minutes on a 2-core machine shared with the rest of the suite: the C1
# compiler only and the serial collector (as the test broker, tests/kafka_broker.py) spend a
# fraction of the CPU time that C2 and the parallel collector spend on start-up, and the work
# they do is small.
LEAN_JVM = ["-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]


def java_command(main_class: str, *args: str) -> list[str]:
    # The read's watermark per partition every 30 s in the logs (PartitionWatermarkPolicy, DEBUG).
    read_status = "-Dorg.slf4j.simpleLogger.log.io.ragpulse=debug"
    return ["java", "-Xmx768m", *LEAN_JVM, read_status, *JAVA_17_OPENS, "-cp", beam_classpath(),
            main_class, *args]


# The states of a Flink job that has ended.
FLINK_ENDED = {"CANCELED", "FINISHED", "FAILED"}


@dataclasses.dataclass(frozen=True)
class FlinkServices:
    """The addresses of a running Flink job server, expansion service and worker pool."""

    job_port: int
    artifact_port: int
    expansion_port: int
    pool_port: int
    log_dir: Path
    pids: tuple[int, ...] = ()  # the services' process (and session) ids, once started

    @property
    def expansion_service(self) -> str:
        return f"127.0.0.1:{self.expansion_port}"

    @property
    def stream_args(self) -> list[str]:
        """The `ragpulse stream` flags that submit a job to these services (deploy/flink's
        submit-job.yaml has the same flags, with its cluster's addresses)."""
        return [
            f"--expansion-service={self.expansion_service}",
            "--runner=PortableRunner",
            f"--beam-arg=--job_endpoint=127.0.0.1:{self.job_port}",
            f"--beam-arg=--artifact_endpoint=127.0.0.1:{self.artifact_port}",
            "--beam-arg=--environment_type=EXTERNAL",
            f"--beam-arg=--environment_config=127.0.0.1:{self.pool_port}",
        ]

    def flink_rest_urls(self) -> list[str]:
        """The REST endpoints of the embedded Flinks the job server has started (one per job
        submitted), from its log."""
        log = self.log_dir / "flink-job-server.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        ports = re.findall(r"Rest endpoint listening at localhost:(\d+)", text)
        return [f"http://127.0.0.1:{port}" for port in dict.fromkeys(ports)]

    def running_flink_jobs(self) -> list[tuple[str, str]]:
        """(REST endpoint, Flink job id) of every job an embedded Flink still runs (or is
        cancelling); an endpoint that no longer answers has shut down with its job."""
        found = []
        for url in self.flink_rest_urls():
            try:
                with urllib.request.urlopen(f"{url}/jobs/overview", timeout=10) as response:
                    jobs = json.loads(response.read())["jobs"]
            except OSError:
                continue
            found += [(url, j["jid"]) for j in jobs if j["state"] not in FLINK_ENDED]
        return found

    def cancel_flink_jobs(self) -> None:
        """Cancels every job the embedded Flinks run, through Flink's REST API. Beam's job
        service `Cancel` does not stop a job on `--flink-master=[local]`: it stops waiting for
        it, and the job goes on reading (and committing the group's offsets)."""
        for url, job_id in self.running_flink_jobs():
            request = urllib.request.Request(f"{url}/jobs/{job_id}?mode=cancel", method="PATCH")
            with contextlib.suppress(OSError):  # it ended meanwhile
                urllib.request.urlopen(request, timeout=30).close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}"
            for log in sorted(self.log_dir.glob("*.log"))
        )


@contextmanager
def flink_services(log_dir: Path) -> Iterator[FlinkServices]:
    """Starts the three services on free loopback ports; stops them when the block ends."""
    services = FlinkServices(free_port(), free_port(), free_port(), free_port(), log_dir)
    with ExitStack() as stack:
        pids = []
        pids.append(stack.enter_context(
            service(
                "expansion-service",
                java_command(EXPANSION_SERVICE, *expansion_service_args(services.expansion_port)),
                services.expansion_port,
                log_dir,
            )
        ))
        pids.append(stack.enter_context(
            service(
                "flink-job-server",
                java_command(
                    FLINK_JOB_SERVER,
                    "--flink-master=[local]",
                    "--job-host=127.0.0.1",
                    f"--job-port={services.job_port}",
                    f"--artifact-port={services.artifact_port}",
                    # Its own expansion service is not used (no KafkaIO environment option).
                    f"--expansion-port={free_port()}",
                ),
                services.job_port,
                log_dir,
            )
        ))
        pids.append(stack.enter_context(
            service(
                "worker-pool",
                worker_pool_command(services.pool_port),
                services.pool_port,
                log_dir,
            )
        ))
        yield dataclasses.replace(services, pids=tuple(pids))


@pytest.fixture(scope="module")
def flink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlinkServices]:
    """Fixture `flink`: the Flink job server, expansion service and worker pool for a module;
    their logs are printed at teardown (pytest shows them when a test failed)."""
    log_dir = tmp_path_factory.mktemp("flink")
    try:
        with flink_services(log_dir) as services:
            yield services
    finally:
        print(FlinkServices(0, 0, 0, 0, log_dir).logs())
