"""Apache Kafka with real TLS and SASL listeners, for the tests of pipeline/kafka_security.py.

One broker (`SecureBroker`, tests/kafka_broker.py underneath) serves, beside its plaintext
listener:

    TLS        SSL, the broker certificate of the test CA, no client certificate asked
    MTLS       SSL, a client certificate signed by the test CA required
    SASL       SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; no client certificate
    UNTRUSTED  SSL, a broker certificate of a CA nobody trusts
    WRONGHOST  SSL, a broker certificate of the test CA for kafka.example.invalid only

The SASL user `ragpulse` exists for every mechanism with the password the test module gives:
for PLAIN in the listener's JAAS settings, for SCRAM created on the broker by
`kafka.tools.StorageTool format --add-scram` (so the broker's credential store holds it).
`listener(name)` is a `SecureKafka`: the address, client settings and the count of failed
authentications the broker logged on that listener (its Selector logs each at INFO).

`Pki` makes a CA, a broker certificate for localhost/127.0.0.1, a client certificate, a second
CA nobody trusts, and a broker certificate for another host name (tests/certs.py). Kafka reads
the PEM files directly (ssl.keystore.type=PEM: the unencrypted PKCS#8 key and the certificate in
one file).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from certs import make_ca, make_leaf
from kafka_broker import ApacheKafkaBroker, start_broker

from ragpulse.pipeline.kafka_security import KafkaSecurity

SASL_USER = "ragpulse"


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


def _keystore(cert: Path, key: Path) -> str:
    """A PEM keystore file for Kafka: the private key, then the certificate."""
    store = cert.with_suffix(".keystore.pem")
    store.write_text(key.read_text() + cert.read_text())
    return str(store)


def _ssl(pki: Pki, cert: Path, key: Path, **more: str) -> dict[str, str]:
    return {
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": _keystore(cert, key),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(pki.ca),
        **more,
    }


class SecureKafka:
    """One listener of a SecureBroker, as a client sees it."""

    def __init__(self, broker: ApacheKafkaBroker, name: str, pki: Pki) -> None:
        self.broker = broker
        self.name = name
        self.pki = pki
        self._mark = self._failures()

    @property
    def bootstrap(self) -> str:
        return self.broker.address(self.name)

    def client_security(self, **overrides: object) -> KafkaSecurity:
        """Settings that the listener accepts at the TLS layer (override fields to break them)."""
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

    def _failures(self) -> int:
        # Selector: "Failed authentication with /127.0.0.1 (channelId=127.0.0.1:PORT-...)".
        port = self.broker.ports[self.name]
        pattern = rf"Failed authentication with \S+ \(channelId=127\.0\.0\.1:{port}-"
        return len(re.findall(pattern, self.broker.log_text()))

    def failed_authentications(self) -> int:
        """Authentications (TLS handshakes or SASL exchanges) the broker saw fail on this
        listener since this object was made."""
        return self._failures() - self._mark

    def wait_failed_authentications(self, at_least: int, timeout_s: float = 30.0) -> int:
        """`failed_authentications()` once it reaches `at_least`: the broker logs a failed
        handshake after the client has seen it fail, so a count read at once may be short."""
        deadline = time.monotonic() + timeout_s
        while (count := self.failed_authentications()) < at_least and time.monotonic() < deadline:
            time.sleep(0.1)
        return count

    def logs(self) -> str:
        return self.broker.log_text()[-6000:]


class SecureBroker:
    """The broker with the listeners above; `listener(name)` for each."""

    def __init__(self, folder: Path, password: str) -> None:
        self.pki = Pki(folder / "pki")
        pki = self.pki
        jaas_plain = (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'user_{SASL_USER}="{password}";'
        )
        jaas_scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        self.broker = start_broker(
            listeners={
                "TLS": ("SSL", _ssl(pki, pki.broker_cert, pki.broker_key)),
                "MTLS": ("SSL", _ssl(pki, pki.broker_cert, pki.broker_key,
                                     **{"ssl.client.auth": "required"})),
                "SASL": ("SASL_SSL", _ssl(pki, pki.broker_cert, pki.broker_key, **{
                    "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
                    "plain.sasl.jaas.config": jaas_plain,
                    "scram-sha-256.sasl.jaas.config": jaas_scram,
                    "scram-sha-512.sasl.jaas.config": jaas_scram,
                })),
                "UNTRUSTED": ("SSL", _ssl(pki, pki.untrusted_cert, pki.untrusted_key)),
                "WRONGHOST": ("SSL", _ssl(pki, pki.wrong_host_cert, pki.wrong_host_key)),
            },
            scram_users=[
                ("SCRAM-SHA-256", SASL_USER, password),
                ("SCRAM-SHA-512", SASL_USER, password),
            ],
        )

    def listener(self, name: str) -> SecureKafka:
        return SecureKafka(self.broker, name, self.pki)

    def close(self) -> None:
        self.broker.close()


@pytest.fixture(name="pki")
def pki_fixture(secure_broker: SecureBroker) -> Pki:
    """Fixture `pki`: the certificates of the module's secure broker."""
    return secure_broker.pki
