"""`ragpulse serve` as a real subprocess, for integration tests (serve, Prometheus, Alertmanager).

    serve = ServeProcess(broker.bootstrap, "topic", tmp_path / "state.sqlite",
                         ["--window", "10s"]).start()
    scrape = serve.wait_for(lambda m: m.total("ragpulse_events_total") >= 100, timeout=30)
    assert serve.terminate() == 0

`start()` returns once /metrics answers; `metrics()` parses one scrape with prometheus-client's
parser; `wait_for` polls /metrics until a predicate holds and, when it does not in time, fails
with the last scrape and the end of serve's log. The process runs in its own session, so `kill()`
(SIGKILL) takes down anything it started too. The `serve_processes` fixture hands out a factory
and stops every process it started at teardown, printing each log (pytest shows it on failure);
tests/conftest.py makes it available to every test module.

The `served_topic` fixture creates a topic on the test module's `broker` fixture, fills it, and
starts serve processes on it with 10 s windows:

    topic = served_topic("late", partitions=2, records=simulate(4, 400, T0, rate=10))
    m = topic.serve("--allowed-lateness", "5s").wait_for(caught_up(400), 60, "all events")
    letters = topic.read("dlq", 20)

Defaults suit tests: local judges, /metrics on a free port of 127.0.0.1, a 0.5 s trigger
interval, a 5 s Kafka timeout and a 2 s --partition-idle-after; `extra_args` come last, so
they override these.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson
import pytest
import waiting
from cli import ragpulse, ragpulse_command
from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka_broker import ApacheKafkaBroker
from processes import free_port
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar

from ragpulse.pipeline.commands.simulate import SimulatedEvent
from ragpulse.pipeline.service.state import StateStore

START_TIMEOUT_S = 60.0
T0 = 1_763_632_800.0  # 2025-11-20T10:00:00Z, a multiple of the 10 s windows used here
WINDOW_ARGS = ["--window", "10s"]
OPENMETRICS = "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
Labels = tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Scrape:
    """One /metrics scrape: every sample as (name, labels, value)."""

    samples: tuple[tuple[str, Mapping[str, str], float], ...]

    @classmethod
    def parse(cls, text: str) -> Scrape:
        return cls(
            tuple(
                (s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text)
                for s in family.samples
            )
        )

    def select(self, name: str, **labels: str) -> list[tuple[Mapping[str, str], float]]:
        """Samples called `name` whose labels include `labels`."""
        return [
            (lab, value)
            for n, lab, value in self.samples
            if n == name and all(lab.get(k) == v for k, v in labels.items())
        ]

    def total(self, name: str, **labels: str) -> float:
        """Sum of the samples called `name` whose labels include `labels` (0 when none)."""
        return sum(value for _, value in self.select(name, **labels))

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample called `name` with exactly these labels, or None."""
        found = [v for lab, v in self.select(name, **labels) if dict(lab) == labels]
        return found[0] if found else None

    def by_labels(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        """Samples called `name`, keyed by their sorted label pairs."""
        return {tuple(sorted(lab.items())): v for lab, v in self.select(name)}


class ServeProcess:
    """One `ragpulse serve` subprocess and its /metrics and /healthz endpoints.

    Its TMPDIR is a folder of its own, removed at `stop()`: a serve killed mid-cycle leaves
    the cycle's Beam temp folder (beam-pipeline-temp*) there, not in /tmp."""

    own_temp_dir = True

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        state: Path,
        extra_args: Sequence[str] = (),
        *,
        metrics_port: int | None = None,
        log_path: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.state = Path(state)
        self.extra_args = list(extra_args)
        self.port = metrics_port or free_port()
        # Two free ports asked for one after the other can be the same one (the first socket is
        # closed before the second binds); serve refuses equal ports.
        self.health_port = next(port for port in iter(free_port, None) if port != self.port)
        self.env = dict(env) if env is not None else None
        self.temp_dir: Path | None = None
        if self.own_temp_dir:
            self.temp_dir = Path(tempfile.mkdtemp(prefix="ragpulse-serve-tmp-"))
            self.env = {**(self.env or os.environ), "TMPDIR": str(self.temp_dir)}
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="ragpulse-serve-", suffix=".log")
            os.close(handle)
            log_path = Path(name)
        self.log_path = log_path
        self._log: IO[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [*ragpulse_command(), *self.serve_args()]

    def serve_args(self) -> list[str]:
        """`serve` and its flags: the test defaults, then `extra_args` (which override)."""
        return [
            "serve",
            "--kafka-bootstrap", self.bootstrap,
            "--topic", self.topic,
            "--state", str(self.state),
            "--metrics-host", "127.0.0.1",
            "--metrics-port", str(self.port),
            "--health-port", str(self.health_port),
            "--judge-backend", "local",
            "--trigger-interval", "0.5s",
            "--kafka-timeout", "5s",
            # Tests wait for the watermark to reach the last event once every partition is
            # read; the default (60s) would make each wait a minute.
            "--partition-idle-after", "2s",
            *self.extra_args,
        ]

    def start(self, timeout: float = START_TIMEOUT_S) -> ServeProcess:
        """Start serve and wait until /metrics answers; raises with the log if it never does."""
        return self.launch().answering(timeout)

    def launch(self) -> ServeProcess:
        """Start serve, without waiting for it (`answering` waits): for a serve held at start."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("serve is already running")
        self._log = self.log_path.open("ab")
        self._log.write(f"--- start: {' '.join(self.command())}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(
            self.command(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.env,
        )
        return self

    def answering(self, timeout: float = START_TIMEOUT_S) -> ServeProcess:
        """Wait until the launched serve's /metrics answers; raises with the log if serve exits
        first or /metrics never answers."""
        assert self.process is not None, "launch() first"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"serve exited with code {self.process.returncode} before /metrics "
                    f"answered:\n{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                self.metrics()
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"/metrics did not answer within {timeout}s:\n{self.log_tail()}")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _get(
        self, path: str, timeout: float, accept: str | None = None, base: str | None = None
    ) -> tuple[int, str]:
        request = urllib.request.Request(
            (base or self.url) + path, headers={"Accept": accept or "*/*"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return int(response.status), response.read().decode()
        except urllib.error.HTTPError as exc:  # 503 from /healthz is an answer, not a failure
            return int(exc.code), exc.read().decode()

    def metrics(self, timeout: float = 5.0) -> Scrape:
        """One scrape of /metrics (OSError when nothing answers)."""
        status, body = self._get("/metrics", timeout)
        if status != 200:
            raise OSError(f"/metrics answered {status}: {body[:200]}")
        return Scrape.parse(body)

    def exemplars(self, timeout: float = 5.0) -> dict[tuple[str, Labels], Exemplar]:
        """Exemplars of one scrape of /metrics in the OpenMetrics format (asked for with the
        Accept header Prometheus sends), by sample name and sorted labels."""
        status, body = self._get("/metrics", timeout, accept=OPENMETRICS)
        if status != 200:
            raise OSError(f"/metrics answered {status}: {body[:200]}")
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.exemplar
            for family in openmetrics_families(body)
            for s in family.samples
            if s.exemplar is not None
        }

    def healthz(self, timeout: float = 5.0) -> tuple[int, str]:
        """Status code and body of /healthz, on the health listener (--health-port), where
        the kubelet's probes ask."""
        return self._get("/healthz", timeout, base=f"http://127.0.0.1:{self.health_port}")

    def wait_for(
        self,
        predicate: Callable[[Scrape], bool],
        timeout: float,
        what: str = "the condition",
        interval: float = 0.2,
    ) -> Scrape:
        """Scrape until `predicate(scrape)` holds; returns that scrape, or fails with the log."""
        deadline = time.monotonic() + timeout
        last: Scrape | None = None
        while True:
            if not self.running:
                raise AssertionError(
                    f"serve exited (code {self.returncode}) while waiting for {what}:\n"
                    f"{self.log_tail()}"
                )
            with contextlib.suppress(OSError):
                last = self.metrics()
                if predicate(last):
                    return last
            if time.monotonic() >= deadline:
                break
            time.sleep(interval)
        seen = "" if last is None else "\n".join(
            f"{n}{dict(lab)} {v}" for n, lab, v in last.samples if n.startswith("ragpulse_")
        )
        raise AssertionError(
            f"{what} did not happen within {timeout}s.\nlast scrape:\n{seen}\n"
            f"serve log:\n{self.log_tail()}"
        )

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM (serve finishes its cycle and saves), then wait; returns the exit code."""
        if self.process is None:
            raise RuntimeError("serve was never started")
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        finally:
            self._close_log()

    def kill(self) -> int:
        """SIGKILL serve's whole session at once (a crash); returns the exit code."""
        if self.process is None:
            raise RuntimeError("serve was never started")
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        code = self.process.wait(timeout=30)
        self._close_log()
        return code

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP serve for the block, SIGCONT after: what the test changes meanwhile (a
        topic deleted and refilled) looks to serve like one step, never half-done."""
        if self.process is None:
            raise RuntimeError("serve was never started")
        os.killpg(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """Tear-down: terminate, and kill after 20 s; never raises for a process already gone."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.terminate(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
        self._close_log()
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def windows(self, *args: str) -> list[dict[str, Any]]:
        """Rows of `ragpulse windows --state STATE` (works while serve runs: SQLite WAL)."""
        return windows_rows(self.state, *args)

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def windows_rows(state: Path, *args: str) -> list[dict[str, Any]]:
    """`ragpulse windows --state STATE [ARGS]` run as a subprocess, parsed from JSON lines."""
    done = ragpulse("windows", "--state", str(state), *args, timeout=60)
    if done.returncode != 0:
        raise AssertionError(f"ragpulse windows exited with {done.returncode}: {done.stderr}")
    return [orjson.loads(line) for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture(name="serve_processes")
def serve_processes_fixture() -> Iterator[Callable[..., ServeProcess]]:
    """Fixture `serve_processes`: a factory of (not yet started) ServeProcess objects, all
    stopped at teardown, their logs printed (pytest shows them when the test failed).

    tests/conftest.py makes it available to every test module.
    """
    made: list[ServeProcess] = []

    def make(
        bootstrap: str, topic: str, state: Path, extra_args: Sequence[str] = (), **kwargs: Any
    ) -> ServeProcess:
        serve = ServeProcess(bootstrap, topic, state, extra_args, **kwargs)
        made.append(serve)
        return serve

    try:
        yield make
    finally:
        for serve in made:
            serve.stop()
            print(f"--- ragpulse serve log ({serve.log_path}) ---\n{serve.log_text()}")
            with contextlib.suppress(OSError):
                serve.log_path.unlink()


def read_topic(bootstrap: str, topic: str, expected: int, timeout: float = 20.0) -> list[Any]:
    """Every record of `topic` (all partitions, manual assignment), once `expected` have come.

    Reads on for half a second after that, so that extra records would be seen too.
    """
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
    )
    try:
        deadline = time.monotonic() + timeout
        parts: set[int] = set()
        while not parts and time.monotonic() < deadline:
            parts = consumer.partitions_for_topic(topic) or set()
            time.sleep(0.1)
        assert parts, f"topic {topic} never appeared"
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        records: list[ConsumerRecord] = []
        settle_until: float | None = None
        while time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
            if len(records) >= expected:
                settle_until = settle_until or time.monotonic() + 0.5
                if time.monotonic() >= settle_until:
                    break
        return records
    finally:
        consumer.close(autocommit=False)


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Poll `condition` (a serve's /healthz, its state file, ...) until it holds, or fail
    naming `what` after `timeout` seconds: tests/waiting.py's loop, at a serve test's pace."""
    waiting.wait_until(condition, what, timeout, every_s=0.05)


def caught_up(total: int, watermark: float | None = None) -> Callable[[Scrape], bool]:
    """All `total` records read (accepted or not) and, if given, the watermark reached."""

    def check(m: Scrape) -> bool:
        if m.total("ragpulse_events_total") < total:
            return False
        if watermark is None:
            return True
        wm = m.value("ragpulse_watermark_timestamp_seconds")
        return wm is not None and wm >= watermark - 0.001

    return check


def saved_offsets(state: Path, topic: str) -> dict[int, int]:
    with StateStore(state) as store:
        return store.offsets(topic)


def produce_round_robin(
    broker: ApacheKafkaBroker,
    topic: str,
    records: Iterable[SimulatedEvent | bytes],
    partitions: int,
) -> list[tuple[int, int]]:
    """Record i goes to partition i % partitions (each partition stays in event-time order);
    a simulated event as its payload.

    Returns (partition, offset) per record, in record order.
    """
    payloads = [r if isinstance(r, bytes) else r.payload for r in records]
    where: list[tuple[int, int]] = [(-1, -1)] * len(payloads)
    for p in range(partitions):
        indexes = list(range(p, len(payloads), partitions))
        placed = broker.produce(topic, [payloads[i] for i in indexes], partition=p)
        for i, spot in zip(indexes, placed, strict=True):
            where[i] = spot
    return where


@dataclasses.dataclass(frozen=True)
class ServedTopic:
    """A topic of a test broker and the `ragpulse serve` processes that read it, all with one
    state file; made by the `served_topic` fixture."""

    broker: ApacheKafkaBroker
    name: str
    state: Path
    serve_processes: Callable[..., ServeProcess]
    partitions: int

    def produce(self, records: Iterable[SimulatedEvent | bytes]) -> list[tuple[int, int]]:
        """Round robin over the topic's partitions; (partition, offset) per record."""
        return produce_round_robin(self.broker, self.name, records, self.partitions)

    def read(self, suffix: str, expected: int) -> list[Any]:
        """Every record of the topic NAME.SUFFIX (e.g. "dlq"), once `expected` have come."""
        return read_topic(self.broker.bootstrap, f"{self.name}.{suffix}", expected)

    def serve(self, *args: str, state: Path | None = None) -> ServeProcess:
        """A started serve on the topic, with 10 s windows (WINDOW_ARGS) and then ARGS; its
        state file is the topic's unless `state` names another (a second, independent run)."""
        return self.serve_processes(
            self.broker.bootstrap, self.name, state or self.state, [*WINDOW_ARGS, *args]
        ).start()


TopicFactory = Callable[..., ServedTopic]


@pytest.fixture(name="served_topic")
def served_topic_fixture(
    broker: ApacheKafkaBroker, serve_processes: Callable[..., ServeProcess], tmp_path: Path
) -> Callable[..., ServedTopic]:
    """Fixture `served_topic(name, partitions=1, records=())`: creates the topic on the test
    module's `broker`, produces the records, and returns it as a ServedTopic whose state file
    is tmp_path/state.sqlite.

    tests/conftest.py makes it available to every test module.
    """

    def make(
        name: str, partitions: int = 1, records: Iterable[SimulatedEvent | bytes] = ()
    ) -> ServedTopic:
        broker.create_topic(name, partitions)
        topic = ServedTopic(broker, name, tmp_path / "state.sqlite", serve_processes, partitions)
        if records:
            topic.produce(records)
        return topic

    return make
