"""Kafka behind TLS and with SASL, for the tests of pipeline/kafka_security.py.

Tansu 0.6.0 (the broker of tests/kafka_broker.py) cannot serve these itself, which was checked
by hand: its `--cert` and `--key` options refuse to be given together ("the argument '--cert'
cannot be used with '--key'"), and `--cert` alone leaves the listener in plain TCP. So TLS is
terminated by stunnel4 (Debian package stunnel4) in front of Tansu, which advertises stunnel's
port; stunnel's log counts every connection a client opens.

Tansu's `--authentication` does run real SCRAM-SHA-256 and SCRAM-SHA-512 exchanges (PLAIN is
refused: "NoSharedMechanism"), but no user can be created on it: `tansu user create` is itself
refused with NotAuthenticated, and its memory storage is lost on restart (the postgres and
sqlite engines are not built into this binary). So SASL is tested for rejection: every password
is wrong there, and the broker answers the SCRAM exchange with `e=unknown-user`.

`Pki` makes a CA, a broker certificate for localhost/127.0.0.1, a client certificate, a second
CA nobody trusts, and a broker certificate for another host name (tests/certs.py).
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from certs import make_ca, make_leaf
from kafka_broker import tansu_binary
from processes import free_port, require_binary, stop_process

from pipeline.kafka_security import KafkaSecurity

START_TIMEOUT_S = 20.0


class Pki:
    """Certificates and keys as PEM files under `folder`."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        ca = make_ca(folder, "ca", "ragpulse test CA")
        self.ca = ca.cert
        self.broker_cert, self.broker_key = make_leaf(
            folder, "broker", ca, dns=["localhost"], ips=["127.0.0.1"], server=True
        )
        self.client_cert, self.client_key = make_leaf(folder, "client", ca, server=False)
        self.wrong_host_cert, self.wrong_host_key = make_leaf(
            folder, "wrong-host", ca, dns=["kafka.example.invalid"], server=True
        )
        other = make_ca(folder, "untrusted-ca", "some other CA")
        self.untrusted_cert, self.untrusted_key = make_leaf(
            folder, "untrusted-broker", other, dns=["localhost"], ips=["127.0.0.1"], server=True
        )


def _wait_for_port(port: int, process: subprocess.Popen[bytes], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}:\n{log.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT_S}s")


class SecureKafka:
    """Tansu on a private port, advertised at stunnel's TLS port in front of it.

    `authentication=True` starts Tansu with --authentication (SASL SCRAM required).
    `bootstrap` is the TLS address clients use; `connections()` counts the TCP connections
    stunnel accepted so far.
    """

    def __init__(
        self,
        folder: Path,
        pki: Pki,
        *,
        authentication: bool = False,
        require_client_certificate: bool = True,
        server_cert: tuple[Path, Path] | None = None,
    ) -> None:
        self.folder = folder
        self.pki = pki
        self.authentication = authentication
        self.require_client_certificate = require_client_certificate
        self.server_cert = server_cert or (pki.broker_cert, pki.broker_key)
        self.tls_port = free_port()
        self.plain_port = free_port()
        self.tansu_log = folder / "tansu.log"
        self.stunnel_log = folder / "stunnel.log"
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.tls_port}"

    def client_security(self, **overrides: object) -> KafkaSecurity:
        """Settings that the broker accepts at the TLS layer (override fields to break them)."""
        fields: dict[str, object] = {
            "protocol": "SSL",
            "ssl_cafile": self.pki.ca,
            "ssl_certfile": self.pki.client_cert,
            "ssl_keyfile": self.pki.client_key,
        }
        fields.update(overrides)
        return KafkaSecurity.model_validate(fields)

    def tls_args(self) -> list[str]:
        """serve/simulate flags for the working TLS set-up."""
        return [
            "--kafka-security-protocol", "SSL",
            "--kafka-ssl-cafile", str(self.pki.ca),
            "--kafka-ssl-certfile", str(self.pki.client_cert),
            "--kafka-ssl-keyfile", str(self.pki.client_key),
        ]

    def start(self) -> SecureKafka:
        stunnel = require_binary("stunnel4", "stunnel4")
        tansu = [
            str(tansu_binary()), "broker",
            "--listener-url", f"tcp://127.0.0.1:{self.plain_port}",
            "--advertised-listener-url", f"tcp://127.0.0.1:{self.tls_port}",
            "--storage-engine", "memory://tansu/",
        ]
        if self.authentication:
            tansu.append("--authentication")
        with self.tansu_log.open("wb") as log:
            self._processes.append(subprocess.Popen(tansu, stdout=log, stderr=subprocess.STDOUT))
        _wait_for_port(self.plain_port, self._processes[-1], "tansu", self.tansu_log)
        cert, key = self.server_cert
        config = self.folder / "stunnel.conf"
        config.write_text(
            "foreground = yes\n"
            "pid =\n"
            "debug = 5\n"
            f"output = {self.stunnel_log}\n"
            "[kafka]\n"
            f"accept = 127.0.0.1:{self.tls_port}\n"
            f"connect = 127.0.0.1:{self.plain_port}\n"
            f"cert = {cert}\n"
            f"key = {key}\n"
            + (f"CAfile = {self.pki.ca}\nverifyChain = yes\n"
               if self.require_client_certificate else "")
        )
        with (self.folder / "stunnel.stdout").open("wb") as out:
            self._processes.append(
                subprocess.Popen([stunnel, str(config)], stdout=out, stderr=subprocess.STDOUT)
            )
        _wait_for_port(self.tls_port, self._processes[-1], "stunnel", self.stunnel_log)
        # The readiness probe above is a connection too; count from here.
        time.sleep(0.2)
        self._baseline = self._accepted()
        return self

    def _accepted(self) -> int:
        if not self.stunnel_log.exists():
            return 0
        return len(re.findall(r"accepted connection from", self.stunnel_log.read_text()))

    def connections(self) -> int:
        """TCP connections clients opened to the TLS port since start()."""
        return self._accepted() - self._baseline

    def stop(self) -> None:
        for process in reversed(self._processes):
            stop_process(process, grace_s=5)
        self._processes.clear()

    def logs(self) -> str:
        parts = []
        for path in (self.tansu_log, self.stunnel_log):
            if path.exists():
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)


@pytest.fixture(name="pki")
def pki_fixture(tmp_path: Path) -> Pki:
    """Fixture `pki`: fresh certificates for one test."""
    return Pki(tmp_path / "pki")


def secure_kafka(tmp_path: Path, pki: Pki, **options: object) -> Iterator[SecureKafka]:
    """Start a SecureKafka in `tmp_path`, yield it, stop it (printing its logs)."""
    folder = tmp_path / f"kafka-{free_port()}"
    folder.mkdir()
    broker = SecureKafka(folder, pki, **options)  # type: ignore[arg-type]
    try:
        yield broker.start()
    finally:
        broker.stop()
        print(broker.logs())
