"""Kafka TLS and SASL settings (pipeline/kafka_security.py), parsed and used against a real broker.

The broker is Apache Kafka with real TLS, mTLS and SASL_SSL listeners (PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512, the user created on the broker): tests/secure_kafka.py. Serve and simulate run
as real subprocesses; what they log and print is checked for the setting they name and for
secrets they must not show. The broker's own log counts the failed authentications, so a test
sees that a command gave up after one try.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli import ragpulse
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic, ScramMechanism, UserScramCredentialUpsertion
from kafka.errors import KafkaTimeoutError
from processes import free_port
from secure_kafka import SASL_USER, Pki, SecureBroker, SecureKafka
from serve_process import ServeProcess, serve_processes_fixture  # noqa: F401

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.kafka_security import (
    ENV_SASL_PASSWORD,
    KafkaSecurity,
    KafkaSecurityError,
    check_access,
    connect,
    file_token_provider,
    read_properties,
    security_from,
)
from ragpulse.pipeline.settings.blocks import kafka_security
from ragpulse.pipeline.settings.flags import FlagTable, add_flags, values_of

SECRET = "s3cret-Pa55word"  # must never show in a log, an error or a repr; wrong on the broker
BROKER_PASSWORD = "r1ght-Pa55word-on-the-broker"  # the user's password there; never shown either


KAFKA_SECURITY = kafka_security("kafka security")


def security_from_args(args: argparse.Namespace, env: dict[str, str]) -> KafkaSecurity:
    return security_from(values_of(KAFKA_SECURITY.flags, args), env)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flags(parser, FlagTable(None, (KAFKA_SECURITY,)))
    return parser.parse_args(argv)


def sasl_security(protocol: str, mechanism: str, **more: object) -> KafkaSecurity:
    """SASL settings for the user `ragpulse`, whose password is SECRET."""
    return KafkaSecurity.model_validate({
        "protocol": protocol, "sasl_mechanism": mechanism, "sasl_username": "ragpulse",
        "sasl_password": SECRET, **more,
    })


def ragpulse_output(*argv: str) -> tuple[int, str]:
    """Run the ragpulse CLI; returns (exit code, stdout + stderr)."""
    result = ragpulse(*argv)
    return result.returncode, result.stdout + result.stderr


# --- settings ----------------------------------------------------------------------------------


def test_properties_file_maps_the_java_client_keys_and_flags_override_it(
    tmp_path: Path, pki: Pki
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(
        "# copied from a Java client\n"
        "security.protocol=SASL_SSL\n"
        "sasl.mechanism = SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        f'    username="ragpulse" password="{SECRET}";\n'
        "ssl.truststore.type=PEM\n"
        f"ssl.truststore.location={pki.ca}\n"
        "ssl.endpoint.identification.algorithm=https\n"
    )
    s = security_from_args(parse("--kafka-properties", str(props)), env={})
    assert (s.protocol, s.sasl_mechanism, s.sasl_username) == ("SASL_SSL", "SCRAM-SHA-512",
                                                               "ragpulse")
    assert s.sasl_password is not None and s.sasl_password.get_secret_value() == SECRET
    assert s.ssl_cafile == pki.ca and s.ssl_check_hostname
    overridden = security_from_args(
        parse("--kafka-properties", str(props), "--kafka-sasl-mechanism", "SCRAM-SHA-256",
              "--kafka-ssl-no-check-hostname"),
        env={},
    )
    assert overridden.sasl_mechanism == "SCRAM-SHA-256" and not overridden.ssl_check_hostname
    config = s.client_config()
    assert config["security_protocol"] == "SASL_SSL"
    assert config["sasl_plain_password"] == SECRET
    assert config["ssl_context"].check_hostname


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("request.timeout.ms=1000", "'request.timeout.ms'"),
        ("ssl.truststore.type=JKS", "ssl.truststore.type other than PEM"),
        ("ssl.truststore.location=/etc/kafka/truststore.jks", "ssl.truststore.location needs"),
        ("bootstrap.servers=kafka:9092", "bootstrap.servers"),
        ("sasl.mechanism=GSSAPI", "sasl.mechanism is not supported"),
        ("sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;",
         "Krb5LoginModule"),
    ],
)
def test_properties_file_rejects_keys_it_cannot_honour_naming_the_key(
    tmp_path: Path, line: str, named: str
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(f"security.protocol=SSL\n{line}\n")
    with pytest.raises(KafkaSecurityError, match=named.replace(".", r"\.")):
        read_properties(props)


def test_a_malformed_properties_line_is_reported_by_number_without_echoing_it(
    tmp_path: Path,
) -> None:
    props = tmp_path / "client.properties"
    props.write_text(f"security.protocol=SSL\n{SECRET}\n")
    with pytest.raises(KafkaSecurityError, match="line 2 is not key=value") as caught:
        read_properties(props)
    assert SECRET not in str(caught.value)


def test_sasl_password_comes_from_its_file_or_the_environment_and_never_shows(
    tmp_path: Path,
) -> None:
    password_file = tmp_path / "password"
    password_file.write_text(SECRET + "\n")  # `echo` adds the newline; it is not the password
    base = ("--kafka-security-protocol", "SASL_PLAINTEXT", "--kafka-sasl-mechanism", "PLAIN",
            "--kafka-sasl-username", "ragpulse")
    from_file = security_from_args(
        parse(*base, "--kafka-sasl-password-file", str(password_file)), env={}
    )
    from_env = security_from_args(parse(*base), env={ENV_SASL_PASSWORD: SECRET})
    for s in (from_file, from_env):
        assert s.client_config()["sasl_plain_password"] == SECRET
        # Beam pickles the settings into every reader DoFn.
        assert pickle.loads(pickle.dumps(s)).client_config()["sasl_plain_password"] == SECRET
        assert SECRET not in repr(s) and SECRET not in s.describe() and SECRET not in str(s)
    with pytest.raises(KafkaSecurityError, match="needs a password: --kafka-sasl-password-file"):
        security_from_args(parse(*base), env={})


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (("--kafka-sasl-mechanism", "PLAIN"), "--kafka-sasl-mechanism PLAIN given, but"),
        (("--kafka-security-protocol", "SASL_SSL"), "needs --kafka-sasl-mechanism"),
        (("--kafka-ssl-cafile", "ca.pem"), "--kafka-ssl-cafile given, but"),
        (("--kafka-security-protocol", "SSL", "--kafka-ssl-cafile", "/nonexistent/ca.pem"),
         "--kafka-ssl-cafile /nonexistent/ca.pem: no such file"),
        (("--kafka-security-protocol", "SASL_SSL", "--kafka-sasl-mechanism", "OAUTHBEARER"),
         "needs --kafka-sasl-oauth-token-file"),
    ],
)
def test_settings_that_cannot_work_are_refused_naming_the_flag(
    argv: tuple[str, ...], named: str
) -> None:
    with pytest.raises(KafkaSecurityError, match=named.replace(".", r"\.")):
        security_from_args(parse(*argv), env={})


def test_a_ca_file_that_is_not_pem_is_refused_at_start_up(tmp_path: Path) -> None:
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate\n")
    with pytest.raises(KafkaSecurityError, match=r"--kafka-ssl-cafile .*not a readable PEM"):
        security_from_args(
            parse("--kafka-security-protocol", "SSL", "--kafka-ssl-cafile", str(bad)), env={}
        )


def test_oauth_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    provider = file_token_provider(token_file)
    assert provider.token() == "first-token"
    token_file.write_text("second-token-which-is-longer\n")
    assert provider.token() == "second-token-which-is-longer"


def test_kafka_python_debug_log_of_a_client_configuration_hides_the_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    security = sasl_security("SASL_PLAINTEXT", "PLAIN")
    caplog.set_level(logging.DEBUG)
    # `ragpulse` commands run earlier in the session quiet the "kafka" logger below DEBUG.
    caplog.set_level(logging.DEBUG, logger="kafka")
    with pytest.raises(KafkaTimeoutError):  # nothing listens; the log line is written first
        connect(KafkaAdminClient, f"127.0.0.1:{free_port()}", security,
                bootstrap_timeout_ms=300, request_timeout_ms=300)
    assert "Starting KafkaAdminClient with configuration" in caplog.text
    assert "sasl_plain_password" in caplog.text and SECRET not in caplog.text


def test_an_unreachable_broker_is_not_mistaken_for_a_refused_password(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """serve must keep retrying a broker that is down, not stop as if the password were wrong."""
    security = sasl_security("SASL_SSL", "SCRAM-SHA-512")
    for bootstrap in (f"127.0.0.1:{free_port()}", "kafka.example.invalid:9093"):
        check_access(bootstrap, security, timeout_s=5)  # no KafkaSecurityError
    assert caplog.text.count("not reachable") == 2


# --- against Apache Kafka's TLS and SASL listeners -------------------------------------------


@pytest.fixture(name="pki")
def pki_fixture(tmp_path: Path) -> Pki:
    """Fixture `pki`: fresh certificates for one test that needs no broker."""
    return Pki(tmp_path / "pki")


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """The module's broker with TLS, mTLS, SASL_SSL and two bad-certificate listeners."""
    try:
        broker = SecureBroker(tmp_path_factory.mktemp("secure-kafka"), BROKER_PASSWORD)
    except FileNotFoundError as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield broker
    finally:
        log = broker.broker.log_text()
        assert SECRET not in log and BROKER_PASSWORD not in log
        broker.close()


@pytest.fixture
def tls_kafka(secure_broker: SecureBroker) -> SecureKafka:
    """The listener that requires a client certificate signed by the test CA."""
    return secure_broker.listener("MTLS")


@pytest.fixture
def sasl_kafka(secure_broker: SecureBroker) -> SecureKafka:
    """The SASL_SSL listener (no client certificate)."""
    return secure_broker.listener("SASL")


def _create_topic(kafka: SecureKafka, name: str, partitions: int = 1) -> None:
    admin = connect(KafkaAdminClient, kafka.bootstrap, kafka.client_security())
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


def _read_all(kafka: SecureKafka, topic: str, expected: int, timeout: float = 30) -> list[bytes]:
    consumer = connect(KafkaConsumer, kafka.bootstrap, kafka.client_security(),
                       auto_offset_reset="earliest", enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or [0]]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value for r in records)
        return values
    finally:
        consumer.close()


def test_serve_reads_dead_letters_and_commits_through_mutual_tls(
    tls_kafka: SecureKafka, serve_processes, tmp_path: Path
) -> None:
    """Every client serve makes (offset look-ups, readers, the dead-letter producer, the group
    commit) goes through the mTLS listener: it speaks only TLS with a client certificate."""
    _create_topic(tls_kafka, "chat")
    producer = connect(KafkaProducer, tls_kafka.bootstrap, tls_kafka.client_security())
    good = [e.payload for e in simulate(7, 40, time.time() - 60)]
    for value in [*good, b"{not json", b"[1, 2]"]:
        producer.send("chat", value)
    producer.flush(timeout=30)
    producer.close()

    serve: ServeProcess = serve_processes(
        tls_kafka.bootstrap, "chat", tmp_path / "state.sqlite",
        [*tls_kafka.tls_args(), "--group-id", "ragpulse-tls"],
    ).start()
    m = serve.wait_for(lambda s: s.total("ragpulse_events_total") >= 42, 60, "42 events")
    assert m.value("ragpulse_events_total", outcome="accepted") == 40
    assert m.value("ragpulse_events_total", outcome="invalid") == 2
    assert sorted(_read_all(tls_kafka, "chat.dlq", 2)) == sorted([b"{not json", b"[1, 2]"])
    consumer = connect(KafkaConsumer, tls_kafka.bootstrap, tls_kafka.client_security(),
                       group_id="ragpulse-tls", enable_auto_commit=False)
    try:
        deadline = time.monotonic() + 30
        while consumer.committed(TopicPartition("chat", 0)) != 42:
            assert time.monotonic() < deadline, "offsets were not committed over TLS"
            time.sleep(0.5)
    finally:
        consumer.close()
    log = serve.log_path.read_text()
    assert "(SSL, CA " in log and "client certificate" in log
    assert tls_kafka.failed_authentications() == 0, tls_kafka.logs()


def test_simulate_produces_through_tls_and_creates_its_topic(tls_kafka: SecureKafka) -> None:
    code, output = ragpulse_output(
        "simulate", "--kafka-bootstrap", tls_kafka.bootstrap, "--topic", "sim",
        "--partitions", "1", "--rate", "200", "--duration", "0.25s", *tls_kafka.tls_args(),
    )
    assert code == 0, output
    assert len(_read_all(tls_kafka, "sim", 50)) == 50


@pytest.mark.parametrize("command", ["serve", "simulate"])
def test_an_untrusted_broker_certificate_stops_the_command_naming_the_ca_setting_after_one_try(
    secure_broker: SecureBroker, tmp_path: Path, command: str
) -> None:
    kafka = secure_broker.listener("UNTRUSTED")
    code, output = ragpulse_output(*_command(command, kafka, tmp_path), *kafka.tls_args())
    assert code == 2, output
    assert one_line(output).startswith(f"ragpulse {command}: Kafka TLS handshake with 127.0.0.1:")
    assert "certificate not trusted" in output and "check --kafka-ssl-cafile" in output, output
    assert "Traceback" not in output
    assert kafka.failed_authentications() <= 2, kafka.logs()


def test_a_broker_certificate_for_another_host_is_refused_unless_verification_is_switched_off(
    secure_broker: SecureBroker,
) -> None:
    kafka = secure_broker.listener("WRONGHOST")
    with pytest.raises(KafkaSecurityError, match="does not name this host"):
        check_access(kafka.bootstrap, kafka.client_security(), timeout_s=10)
    check_access(kafka.bootstrap, kafka.client_security(ssl_check_hostname=False), timeout_s=10)


def test_a_missing_client_certificate_is_reported_as_such(tls_kafka: SecureKafka) -> None:
    without = tls_kafka.client_security(ssl_certfile=None, ssl_keyfile=None)
    with pytest.raises(KafkaSecurityError, match="check --kafka-ssl-certfile"):
        check_access(tls_kafka.bootstrap, without, timeout_s=10)
    assert tls_kafka.wait_failed_authentications(at_least=1) == 1, tls_kafka.logs()


def test_tls_without_a_client_certificate_works_where_the_broker_asks_for_none(
    secure_broker: SecureBroker,
) -> None:
    kafka = secure_broker.listener("TLS")
    check_access(kafka.bootstrap, kafka.client_security(ssl_certfile=None, ssl_keyfile=None),
                 timeout_s=10)
    assert kafka.failed_authentications() == 0, kafka.logs()


# --- against the SASL_SSL listener -------------------------------------------------------------


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    """A file holding SECRET (a password the broker does not know), as a password or token file."""
    path = tmp_path / "secret"
    path.write_text(SECRET)
    return path


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    """A file holding the user's password on the broker."""
    path = tmp_path / "password"
    path.write_text(BROKER_PASSWORD + "\n")
    return path


def _command(command: str, kafka: SecureKafka, tmp_path: Path) -> list[str]:
    if command == "serve":
        return ["serve", "--kafka-bootstrap", kafka.bootstrap, "--topic", "chat",
                "--state", str(tmp_path / "state.sqlite"), "--metrics-host", "127.0.0.1",
                "--metrics-port", "0", "--health-port", "0", "--judge-backend", "local",
                "--kafka-timeout", "5s"]
    return ["simulate", "--kafka-bootstrap", kafka.bootstrap, "--topic", "chat",
            "--rate", "10", "--duration", "1s"]


def one_line(output: str) -> str:
    """The one line a refused command prints that is not a log line of an earlier stage."""
    lines = [line for line in output.splitlines() if line.startswith("ragpulse ")]
    assert len(lines) == 1, output
    return lines[0]


def _sasl_args(kafka: SecureKafka, mechanism: str, password: Path) -> list[str]:
    return ["--kafka-security-protocol", "SASL_SSL", "--kafka-ssl-cafile", str(kafka.pki.ca),
            "--kafka-sasl-mechanism", mechanism, "--kafka-sasl-username", SASL_USER,
            "--kafka-sasl-password-file", str(password)]


@pytest.mark.parametrize("command", ["serve", "simulate"])
@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_wrong_sasl_password_stops_the_command_naming_the_settings_without_showing_it(
    tmp_path: Path, sasl_kafka: SecureKafka, secret_file: Path, mechanism: str, command: str,
) -> None:
    code, output = ragpulse_output(
        "--log-level", "DEBUG",
        *_command(command, sasl_kafka, tmp_path), *_sasl_args(sasl_kafka, mechanism, secret_file),
    )
    assert code == 2, output
    line = one_line(output)
    assert line.startswith(
        f"ragpulse {command}: Kafka SASL {mechanism} authentication with 127.0.0.1:"
    ), output
    assert f"check --kafka-sasl-username ({SASL_USER}) and the password" in line
    assert SECRET not in output  # not even at DEBUG, where kafka-python logs too
    assert sasl_kafka.failed_authentications() <= 2, sasl_kafka.logs()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_serve_and_simulate_authenticate_with_the_user_created_on_the_broker(
    tmp_path: Path, sasl_kafka: SecureKafka, password_file: Path, serve_processes, mechanism: str,
) -> None:
    topic = f"sasl-{mechanism.lower()}"
    code, output = ragpulse_output(
        "--log-level", "DEBUG", "simulate", "--kafka-bootstrap", sasl_kafka.bootstrap,
        "--topic", topic, "--partitions", "1", "--rate", "200", "--duration", "0.25s",
        *_sasl_args(sasl_kafka, mechanism, password_file),
    )
    assert code == 0, output
    assert BROKER_PASSWORD not in output
    serve: ServeProcess = serve_processes(
        sasl_kafka.bootstrap, topic, tmp_path / "state.sqlite",
        _sasl_args(sasl_kafka, mechanism, password_file),
    ).start()
    m = serve.wait_for(lambda s: s.total("ragpulse_events_total") >= 50, 60, "50 events")
    assert m.value("ragpulse_events_total", outcome="accepted") == 50
    assert BROKER_PASSWORD not in serve.log_path.read_text()
    assert sasl_kafka.failed_authentications() == 0, sasl_kafka.logs()


def test_a_scram_user_added_on_the_running_broker_can_connect(
    secure_broker: SecureBroker, sasl_kafka: SecureKafka
) -> None:
    """AlterUserScramCredentials (what `kafka-configs --alter --add-config SCRAM-SHA-512=...`
    sends): a user made while the broker runs authenticates at once; its old password not."""
    admin = secure_broker.broker.admin()
    try:
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion("late-user", ScramMechanism.SCRAM_SHA_512, "late-Pa55")]
        )
    finally:
        admin.close()
    security = KafkaSecurity.model_validate({
        "protocol": "SASL_SSL", "ssl_cafile": sasl_kafka.pki.ca,
        "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "late-user",
        "sasl_password": "late-Pa55",
    })
    deadline = time.monotonic() + 30
    while True:  # the credential reaches the broker's cache through the metadata log
        try:
            check_access(sasl_kafka.bootstrap, security, timeout_s=10)
            break
        except KafkaSecurityError:
            assert time.monotonic() < deadline, sasl_kafka.logs()
            time.sleep(0.2)


def test_a_sasl_mechanism_the_broker_does_not_offer_is_named_with_what_to_check(
    sasl_kafka: SecureKafka, secret_file: Path
) -> None:
    """The listener offers PLAIN and SCRAM only, not OAUTHBEARER."""
    security = sasl_security(
        "SASL_SSL", "OAUTHBEARER", ssl_cafile=sasl_kafka.pki.ca, sasl_oauth_token_file=secret_file
    )
    with pytest.raises(KafkaSecurityError, match="SASL OAUTHBEARER") as caught:
        check_access(sasl_kafka.bootstrap, security, timeout_s=10)
    # The broker answers UNSUPPORTED_SASL_MECHANISM and closes the connection; which of the two
    # kafka-python sees first varies, so either setting may be named.
    message = str(caught.value)
    assert "--kafka-sasl-mechanism" in message or "--kafka-sasl-oauth-token-file" in message
    assert SECRET not in message
