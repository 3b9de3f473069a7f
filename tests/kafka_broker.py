"""Apache Kafka (a single-node KRaft broker, from the Maven jars) for tests and benchmarks.

`ApacheKafkaBroker` is a context manager: it formats a fresh data folder with
`kafka.tools.StorageTool format --standalone`, starts `kafka.Kafka server.properties` with java
on free ports of 127.0.0.1, and stops it by PID. The jars are installed by `make kafka` (which
`make test` runs) into $RAGPULSE_CACHE/kafka-4.4.0/lib (default .cache/ at the repo root), from
the pinned .ci/tools/kafka/pom.xml.

    with ApacheKafkaBroker() as broker:
        broker.create_topic("events", partitions=2)
        broker.produce("events", [b"a", b"b"], partition=0)

Starting one takes seconds (a JVM, twice), so the tests share one broker per session (per
pytest-xdist worker): `kafka_broker` hands it to one test and, at teardown, deletes the topics
and consumer groups the test made, restarting the broker if the test stopped it. Modules whose
`broker` fixture is module-scoped get the same session broker from `apache_kafka` and give each
test its own topic. Test modules import the fixtures (`from kafka_broker import kafka_broker`):
pytest puts `tests/` on sys.path.

The broker is set up for tests: no retention by age unless a topic asks for it (tests produce
records stamped in the past), retention is checked every second from the start, and deleted
segments go at once, so a test can watch the log start move (`log_start_offsets`).
`listeners` adds TLS and SASL listeners beside the plaintext one (tests/secure_kafka.py).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import pytest
from kafka import KafkaAdminClient, KafkaProducer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions, NewTopic
from kafka.errors import CoordinatorLoadInProgressError, KafkaError
from processes import free_port, stop_process

KAFKA_VERSION = "4.4.0"
START_TIMEOUT_S = 180.0  # two JVM starts on a loaded 2-core machine
REPO = Path(__file__).resolve().parent.parent

# Settings every test broker gets; `broker_config` adds or overrides.
BASE_CONFIG: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # Kafka's default, which serve relies on for its dead-letter and verdict topics.
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
    # No retention by age (tests produce records stamped in 2023-2025), unless a topic asks;
    # retention runs every second from the start and deleted segments go 100 ms later (the log
    # start offset moves at once). Not 0: Kafka's segment-deletion task then reschedules itself
    # with no delay for ever, and the idle broker burns ~9 % of a core in its scheduler threads
    # (2.5 % with 100 ms; tests/bench/bench_kafka_broker_idle.py).
    "log.retention.ms": "-1",
    "log.retention.check.interval.ms": "1000",
    "log.initial.task.delay.ms": "0",
    "log.segment.delete.delay.ms": "100",
    "file.delete.delay.ms": "0",
}
# Quick JVM start: C1 only, a small serial heap (measured figures: docs/figures.md).
JVM_OPTIONS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-Djava.awt.headless=true"]
LOG4J2 = """status = error
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = OUT
logger.config.name = org.apache.kafka.common.config
logger.config.level = warn
logger.kconfig.name = kafka.server.KafkaConfig
logger.kconfig.level = warn
"""


def cache_dir() -> Path:
    """The pinned-tools cache: $RAGPULSE_CACHE, else .cache/ at the repo root."""
    return Path(os.environ.get("RAGPULSE_CACHE") or REPO / ".cache")


def kafka_classpath() -> str:
    """The broker's classpath (every jar `make kafka` installed); FileNotFoundError if absent."""
    lib = cache_dir() / f"kafka-{KAFKA_VERSION}" / "lib"
    if not (lib / f"kafka_2.13-{KAFKA_VERSION}.jar").is_file():
        raise FileNotFoundError(
            f"Apache Kafka {KAFKA_VERSION} is not installed in {lib}: run `make kafka` "
            "(Maven resolves .ci/tools/kafka/pom.xml from Maven Central; `make test` does it)"
        )
    return f"{lib}/*"


def java_binary() -> str:
    found = shutil.which("java")
    if found is None:
        raise FileNotFoundError(
            "java is not installed: Apache Kafka 4 needs Java 17 or newer "
            "(apt-get install -y openjdk-17-jre-headless)"
        )
    return found


def _cluster_id() -> str:
    """A random KRaft cluster id (16 bytes, URL-safe base64) that does not start with "-": the
    storage tool would read one that does as an option (Kafka's own Uuid.randomUuid skips
    those too), and one format in 64 failed."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class ApacheKafkaBroker:
    """A single-node Apache Kafka broker (KRaft, broker and controller in one JVM).

    `listeners` maps more listener names to (security protocol, extra settings with the
    listener's own prefix removed), e.g. {"MTLS": ("SSL", {"ssl.client.auth": "required", ...})};
    `broker_config` adds broker settings; `scram_users` (mechanism, user, password) are created
    at format time. `ports[name]` is each listener's port; `bootstrap` the plaintext one's.
    """

    def __init__(
        self,
        *,
        listeners: Mapping[str, tuple[str, Mapping[str, str]]] | None = None,
        broker_config: Mapping[str, str] | None = None,
        scram_users: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        self.classpath = kafka_classpath()
        self.java = java_binary()
        self.listeners = dict(listeners or {})
        self.broker_config = dict(broker_config or {})
        self.scram_users = list(scram_users)
        self.ports = {name: free_port() for name in ("PLAINTEXT", "CONTROLLER", *self.listeners)}
        self.folder = Path(tempfile.mkdtemp(prefix="apache-kafka-"))
        self.log_path = self.folder / "broker.log"
        self._log_file: IO[bytes] = self.log_path.open("ab")
        self._process: subprocess.Popen[bytes] | None = None
        self._formatted = False
        self.start_seconds: float | None = None  # of the last start(), format included

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.ports['PLAINTEXT']}"

    def address(self, listener: str) -> str:
        """host:port of a listener given in `listeners`."""
        return f"127.0.0.1:{self.ports[listener]}"

    @property
    def pid(self) -> int:
        """The running broker's process id (benchmarks read its CPU time and memory)."""
        assert self._process is not None, "the broker is not running"
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def rss_bytes(self) -> int:
        """The broker JVM's resident memory now (Linux /proc)."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS line in /proc/PID/status")

    def _config(self) -> dict[str, str]:
        names = ["PLAINTEXT", "CONTROLLER", *self.listeners]
        protocols = {"PLAINTEXT": "PLAINTEXT", "CONTROLLER": "PLAINTEXT"}
        config = dict(BASE_CONFIG)
        for name, (protocol, settings) in self.listeners.items():
            protocols[name] = protocol
            for key, value in settings.items():
                config[f"listener.name.{name.lower()}.{key}"] = value
        config.update({
            "listeners": ",".join(f"{n}://127.0.0.1:{self.ports[n]}" for n in names),
            "advertised.listeners": ",".join(
                f"{n}://127.0.0.1:{self.ports[n]}" for n in names if n != "CONTROLLER"
            ),
            "listener.security.protocol.map": ",".join(f"{n}:{protocols[n]}" for n in names),
            "controller.quorum.bootstrap.servers": f"127.0.0.1:{self.ports['CONTROLLER']}",
            "log.dirs": str(self.folder / "data"),
        })
        config.update(self.broker_config)
        return config

    def _java(self, main: str, *args: str) -> list[str]:
        return [self.java, *JVM_OPTIONS, "-cp", self.classpath,
                f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}", main, *args]

    def _format(self) -> None:
        properties = self.folder / "server.properties"
        properties.write_text(
            "".join(f"{key}={value}\n" for key, value in self._config().items())
        )
        (self.folder / "log4j2.properties").write_text(LOG4J2)
        cluster_id = _cluster_id()
        scram: list[str] = []
        for mechanism, user, password in self.scram_users:
            scram += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
        result = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                       "-c", str(properties), "--standalone", *scram),
            capture_output=True, text=True, check=False,
        )
        self._log_file.write(f"--- StorageTool format ---\n{result.stdout}{result.stderr}".encode())
        self._log_file.flush()
        if result.returncode != 0:
            raise RuntimeError(
                f"kafka.tools.StorageTool format exited with {result.returncode}:\n"
                f"{result.stdout[-3000:]}{result.stderr[-3000:]}"
            )
        self._formatted = True

    def start(self) -> None:
        """Format the data folder (first start only), start the broker, and wait until it
        answers a metadata request."""
        started = time.monotonic()
        if not self._formatted:
            self._format()
        self._process = subprocess.Popen(
            self._java("kafka.Kafka", str(self.folder / "server.properties")),
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        deadline = started + START_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"Apache Kafka exited with code {self._process.returncode}:\n"
                    f"{self.log_text()[-5000:]}"
                )
            try:
                # A TCP probe first: kafka-python's bootstrap backs off up to ~30 s between
                # refused connections, which would make every start take that long.
                with socket.create_connection(("127.0.0.1", self.ports["PLAINTEXT"]), timeout=1):
                    pass
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
                try:
                    admin.list_topics()
                finally:
                    admin.close()
                self.start_seconds = time.monotonic() - started
                return
            except Exception as exc:  # the broker is still starting
                last_error = exc
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(
            f"Apache Kafka did not answer a metadata request within {START_TIMEOUT_S}s "
            f"({last_error!r}):\n{self.log_text()[-5000:]}"
        )

    def stop(self) -> None:
        """Stop the broker (SIGTERM: a controlled shutdown; SIGKILL after 30 s)."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, grace_s=30)

    def restart(self) -> None:
        """Stop and start again on the same ports; the data (topics, offsets) is kept."""
        self.stop()
        self.start()

    def log_text(self) -> str:
        self._log_file.flush()
        return self.log_path.read_text(errors="replace")

    def admin(self) -> KafkaAdminClient:
        """An admin client on the plaintext listener (close it)."""
        return KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=30_000)

    def create_topic(
        self, name: str, partitions: int = 1, config: Mapping[str, str] | None = None
    ) -> None:
        """Create `name` (with topic-level `config`, e.g. {"retention.ms": "1"}) and wait
        until its partitions have a leader."""
        admin = self.admin()
        try:
            admin.create_topics(
                [NewTopic(name, partitions, 1, topic_configs=dict(config or {}))]
            )
        finally:
            admin.close()
        self._wait_for_leaders(name, partitions)

    def _wait_for_leaders(self, name: str, partitions: int) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap)
        try:
            deadline = time.monotonic() + 30
            while len(producer.partitions_for(name) or ()) < partitions:
                assert time.monotonic() < deadline, f"topic {name} has no leader after 30 s"
                time.sleep(0.05)
        finally:
            producer.close()

    def delete_topic(self, name: str) -> None:
        """Delete `name` and wait until the broker no longer lists it (so it can be created
        again at once)."""
        admin = self.admin()
        try:
            admin.delete_topics([name])
            deadline = time.monotonic() + 30
            while name in admin.list_topics():
                assert time.monotonic() < deadline, f"topic {name} still listed after 30 s"
                time.sleep(0.05)
        finally:
            admin.close()

    def add_partitions(self, name: str, total: int) -> None:
        """CreatePartitions: grow `name` to `total` partitions (its records stay)."""
        admin = self.admin()
        try:
            admin.create_partitions({name: NewPartitions(total)})
        finally:
            admin.close()
        self._wait_for_leaders(name, total)

    def alter_topic_config(self, name: str, config: Mapping[str, str]) -> None:
        admin = self.admin()
        try:
            admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, dict(config))])
        finally:
            admin.close()

    def delete_records(self, name: str, before: Mapping[int, int]) -> None:
        """DeleteRecords: move partition p's log start to `before[p]`."""
        admin = self.admin()
        try:
            admin.delete_records({TopicPartition(name, p): o for p, o in before.items()})
        finally:
            admin.close()

    def log_start_offsets(self, name: str, partitions: Iterable[int] = (0,)) -> dict[int, int]:
        """The broker's earliest offset (log start) per partition, asked now."""
        from kafka import KafkaConsumer

        consumer = KafkaConsumer(bootstrap_servers=self.bootstrap, enable_auto_commit=False)
        try:
            tps = [TopicPartition(name, p) for p in partitions]
            return {tp.partition: o for tp, o in consumer.beginning_offsets(tps).items()}
        finally:
            consumer.close()

    def produce(
        self,
        topic: str,
        values: Iterable[bytes],
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        max_request_size: int = 1_048_576,
    ) -> list[tuple[int, int]]:
        """`produce` on this broker."""
        return produce(
            self.bootstrap, topic, values, partition, timestamp_ms, headers, max_request_size
        )

    @staticmethod
    def _list_groups(admin: Any) -> list[dict[str, Any]]:
        """The broker's consumer groups; right after a restart the group coordinator is still
        loading __consumer_offsets and answers CoordinatorLoadInProgress, a retriable error."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return list(admin.list_groups())
            except CoordinatorLoadInProgressError:
                assert time.monotonic() < deadline, "the group coordinator still loading after 60 s"
                time.sleep(0.1)

    def forget_test_data(self) -> None:
        """Delete every topic and consumer group a test made (internal topics stay), so the
        next test on this broker starts from nothing; restart the broker if it was stopped."""
        if not self.running:
            self.start()
        admin = self.admin()
        try:
            groups = [g["group_id"] for g in self._list_groups(admin)]
            if groups:
                with contextlib.suppress(KafkaError):
                    admin.delete_groups(groups)
            topics = [t for t in admin.list_topics() if not t.startswith("__")]
            if topics:
                admin.delete_topics(topics)
            deadline = time.monotonic() + 30
            while set(topics) & set(admin.list_topics()):
                assert time.monotonic() < deadline, "topics still listed 30 s after deletion"
                time.sleep(0.05)
        finally:
            admin.close()

    def close(self) -> None:
        self.stop()
        self._log_file.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> ApacheKafkaBroker:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def produce(
    bootstrap: str,
    topic: str,
    values: Iterable[bytes],
    partition: int | None = None,
    timestamp_ms: int | None = None,
    headers: Sequence[tuple[str, bytes]] | None = None,
    max_request_size: int = 1_048_576,
) -> list[tuple[int, int]]:
    """Send `values` to a Kafka-protocol broker (Apache Kafka or Tansu) and wait for every
    ack; returns (partition, offset) per value.

    Raise `max_request_size` (the producer's limit on one request) to send larger records.
    """
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, max_request_size=max_request_size
    )
    try:
        futures = [
            producer.send(
                topic,
                value=value,
                partition=partition,
                timestamp_ms=timestamp_ms,
                headers=list(headers) if headers else None,
            )
            for value in values
        ]
        producer.flush()
        metadata = [future.get(timeout=30) for future in futures]
    finally:
        producer.close()
    return [(m.partition, m.offset) for m in metadata]


def start_broker(**options: object) -> ApacheKafkaBroker:
    """A started broker, or the test fails saying what is missing (`make kafka`, java)."""
    try:
        broker = ApacheKafkaBroker(**options)  # type: ignore[arg-type]
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        broker.start()
    except BaseException:
        print(f"--- Apache Kafka log ({broker.log_path}) ---\n{broker.log_text()[-20000:]}")
        broker.close()
        raise
    return broker


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[ApacheKafkaBroker]:
    """Fixture: the session's broker (one per pytest-xdist worker); tests share it, each with
    its own topics (the `kafka_broker` fixture forgets them after each test)."""
    broker = start_broker()
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture
def kafka_broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    """The session broker for one test: empty of topics and groups when the test starts (the
    previous test's are deleted after it); the end of its log is printed (shown on failure)."""
    position = apache_kafka.log_path.stat().st_size
    try:
        yield apache_kafka
    finally:
        with apache_kafka.log_path.open("rb") as log:
            log.seek(position)
            print(f"--- Apache Kafka log during the test ({apache_kafka.log_path}) ---\n"
                  f"{log.read()[-20000:].decode(errors='replace')}")
        apache_kafka.forget_test_data()


def for_module(broker: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    """Body of a test module's `broker` fixture on the session broker:

        @pytest.fixture(scope="module")
        def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
            yield from for_module(apache_kafka)

    the module's tests give each topic its own name; what they made is deleted at its end."""
    try:
        yield broker
    finally:
        broker.forget_test_data()
