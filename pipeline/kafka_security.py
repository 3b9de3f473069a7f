"""How ragpulse authenticates to Kafka: TLS, SASL (PLAIN, SCRAM, OAUTHBEARER), for every client.

One `KafkaSecurity` value, built in `main()` from the `--kafka-*` flags, an optional Java-style
client properties file (`--kafka-properties`) and the environment, is handed to every place that
makes a Kafka client (reader consumers, offset look-ups and commits, the dead-letter and verdict
producer, simulate's producer). `client_config()` turns it into kafka-python keyword arguments;
it is picklable (only paths and secrets travel), so Beam workers build their clients from it.

Secrets (the SASL password, the TLS key password) come from files or environment variables,
never from flags that show in process lists, and never appear in a log line, an error or a repr.

`check_access` makes ONE connection at start-up and turns a refused certificate or password into
a one-line error that names the setting to fix; those do not heal by retrying, so serve and
simulate stop instead of reconnecting in a loop. An unreachable broker is left to the normal
retry with backoff.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, SecretStr

from ragpulse.pipeline.errors import NOT_SHOWN, SettingsError

log = logging.getLogger(__name__)
T = TypeVar("T")

Protocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
Mechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)
MECHANISMS: tuple[Mechanism, ...] = get_args(Mechanism)

ENV_SASL_USERNAME = "RAGPULSE_KAFKA_SASL_USERNAME"
ENV_SASL_PASSWORD = "RAGPULSE_KAFKA_SASL_PASSWORD"
ENV_SSL_KEY_PASSWORD = "RAGPULSE_KAFKA_SSL_KEY_PASSWORD"


class KafkaSecurityError(SettingsError):
    """Kafka security settings are invalid, or the broker refused them; names the setting."""


class KafkaSecurity(BaseModel):
    """TLS and SASL settings shared by every Kafka client ragpulse makes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    protocol: Protocol = "PLAINTEXT"
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    ssl_key_password: SecretStr | None = None
    ssl_crlfile: Path | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: Mechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    sasl_oauth_token_file: Path | None = None

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def describe(self) -> str:
        """For the start-up log line: protocol, mechanism, user and files; never a secret."""
        parts: list[str] = [self.protocol]
        if self.uses_sasl:
            who = f" as {self.sasl_username}" if self.sasl_username else ""
            parts.append(f"SASL {self.sasl_mechanism}{who}")
        if self.uses_tls:
            parts.append(f"CA {self.ssl_cafile or 'system trust store'}")
            if self.ssl_certfile:
                parts.append(f"client certificate {self.ssl_certfile}")
            if not self.ssl_check_hostname:
                parts.append("hostname verification OFF")
        return ", ".join(parts)

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context of every connection: TLS 1.2+, hostname checked unless switched off."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.ssl_check_hostname
        try:
            if self.ssl_cafile is not None:
                context.load_verify_locations(cafile=str(self.ssl_cafile))
            else:
                context.load_default_certs()
        except (OSError, ssl.SSLError) as exc:
            raise KafkaSecurityError(
                f"--kafka-ssl-cafile {self.ssl_cafile}: not a readable PEM CA bundle ({exc})"
            ) from None
        if self.ssl_cafile is not None and not context.get_ca_certs():
            # OpenSSL accepts a file without any certificate and then trusts nothing.
            raise KafkaSecurityError(
                f"--kafka-ssl-cafile {self.ssl_cafile}: not a readable PEM CA bundle (no "
                "certificate in it)"
            )
        if self.ssl_certfile is not None:
            password = self.ssl_key_password.get_secret_value() if self.ssl_key_password else None
            try:
                context.load_cert_chain(
                    str(self.ssl_certfile),
                    str(self.ssl_keyfile) if self.ssl_keyfile else None,
                    password=password,
                )
            except (OSError, ssl.SSLError) as exc:
                raise KafkaSecurityError(
                    "--kafka-ssl-certfile / --kafka-ssl-keyfile: cannot load the client "
                    f"certificate and key ({type(exc).__name__}); check both files and the key "
                    f"password (--kafka-ssl-key-password-file or {ENV_SSL_KEY_PASSWORD})"
                ) from None
        if self.ssl_crlfile is not None:
            try:
                context.load_verify_locations(cafile=str(self.ssl_crlfile))
            except (OSError, ssl.SSLError) as exc:
                raise KafkaSecurityError(
                    f"--kafka-ssl-crlfile {self.ssl_crlfile}: not a readable PEM CRL ({exc})"
                ) from None
            context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
        return context

    def client_config(self) -> dict[str, Any]:
        """kafka-python keyword arguments for KafkaConsumer, KafkaProducer and KafkaAdminClient."""
        config: dict[str, Any] = {"security_protocol": self.protocol}
        if self.uses_tls:
            config["ssl_context"] = self.ssl_context()
        if self.uses_sasl:
            config["sasl_mechanism"] = self.sasl_mechanism
            if self.sasl_mechanism == "OAUTHBEARER":
                assert self.sasl_oauth_token_file is not None
                config["sasl_oauth_token_provider"] = file_token_provider(
                    self.sasl_oauth_token_file
                )
            else:
                assert self.sasl_password is not None
                config["sasl_plain_username"] = self.sasl_username
                config["sasl_plain_password"] = self.sasl_password.get_secret_value()
        return config


PLAINTEXT = KafkaSecurity()

_SECRET_CONFIG_KEYS = frozenset({"sasl_plain_password", "ssl_password"})


class _RedactSecrets(logging.Filter):
    """kafka-python's admin client logs its whole configuration at DEBUG, passwords included."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, Mapping):
            record.args = _redacted(record.args)
        elif isinstance(record.args, tuple):
            record.args = tuple(_redacted(a) for a in record.args)
        return True


def _redacted(value: Any) -> Any:
    if isinstance(value, Mapping) and _SECRET_CONFIG_KEYS & set(value):
        return {k: "[redacted]" if k in _SECRET_CONFIG_KEYS and v else v for k, v in value.items()}
    return value


logging.getLogger("kafka.admin.client").addFilter(_RedactSecrets())


class _DropSaslExchange(logging.Filter):
    """kafka-python logs every request at DEBUG: the SaslAuthenticate request as an object
    (kafka.net.connection) and every request as raw bytes (kafka.protocol.parser). The SASL
    PLAIN request holds the password in clear, an OAUTHBEARER one the token; found with a real
    SASL/PLAIN listener of Apache Kafka. The parser's raw bytes cannot be told apart, so they
    are dropped; of the connection's lines, those of the SASL exchange."""

    def __init__(self, everything: bool) -> None:
        super().__init__()
        self.everything = everything

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG:
            return True
        return not self.everything and "SaslAuthenticate" not in record.getMessage()


logging.getLogger("kafka.net.connection").addFilter(_DropSaslExchange(everything=False))
logging.getLogger("kafka.protocol.parser").addFilter(_DropSaslExchange(everything=True))


def file_token_provider(path: Path) -> Any:
    """An OAUTHBEARER token provider reading `path`, re-read whenever the file changes.

    A sidecar or a projected Kubernetes token refreshes the file; each new connection (and
    kafka-python's re-authentication) then sends the current token.
    """
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class FileTokenProvider(AbstractTokenProvider):
        def __init__(self) -> None:
            super().__init__()
            self._seen: tuple[int, int] | None = None
            self._token = ""

        def token(self) -> str:
            stat = path.stat()
            if (stat.st_mtime_ns, stat.st_size) != self._seen:
                token = path.read_text(encoding="utf-8").strip()
                if not token:
                    raise KafkaSecurityError(f"--kafka-sasl-oauth-token-file {path} is empty")
                self._token, self._seen = token, (stat.st_mtime_ns, stat.st_size)
            return self._token

    return FileTokenProvider()


# ----- connecting -----------------------------------------------------------------------------


def connect(factory: Callable[..., T], bootstrap: str, security: KafkaSecurity, **config: Any) -> T:
    """`factory(bootstrap_servers=bootstrap, **security, **config)` (a kafka-python client).

    kafka-python reports a refused certificate or password as "Unable to bootstrap" after its
    timeout; this asks the broker once more and raises the real cause, naming the setting.
    """
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    try:
        return factory(bootstrap_servers=bootstrap, **security.client_config(), **config)
    except (KafkaTimeoutError, KafkaConnectionError):
        check_access(bootstrap, security, timeout_s=10.0)
        raise


def check_access(bootstrap: str, security: KafkaSecurity, *, timeout_s: float) -> None:
    """Connect once to the first bootstrap server (TCP, TLS handshake, SASL exchange).

    Raises KafkaSecurityError, naming the setting, when the broker's certificate is not trusted
    or does not match, the broker refuses the client certificate, or SASL fails: retrying cannot
    fix those. An unreachable broker only logs a warning; callers retry that with backoff.
    """
    from kafka.net.compat import KafkaNetClient

    timeout_ms = int(timeout_s * 1000)
    client = KafkaNetClient(
        bootstrap_servers=bootstrap, request_timeout_ms=timeout_ms, **security.client_config()
    )
    try:
        node = client.cluster.bootstrap_brokers()[0]
        # kafka-python has no public call for "connect once and tell me why not"; its own
        # connection manager does exactly the handshake every client will do.
        conn = client._manager.get_connection(node.node_id, timeout_ms=timeout_ms)
        client._net.poll(timeout_ms=timeout_ms, future=conn.init_future)
        future = conn.init_future
        where = f"{node.host}:{node.port}"
        if not future.is_done:
            log.warning("Kafka broker %s did not answer within %.0fs", where, timeout_s)
        elif future.failed():
            problem = diagnose(future.exception, security, where)
            if problem is not None:
                raise KafkaSecurityError(problem)
            log.warning("Kafka broker %s not reachable: %s", where, future.exception)
    finally:
        client.close()


# How kafka-python words failures that retrying may heal (the broker is down or unreachable).
_NETWORK = ("connection refused", "econnrefused", "dns resolution", "name or service not known",
            "temporary failure in name", "no route to host", "ehostunreach", "timed out",
            "etimedout", "network is unreachable", "enetunreach")


def diagnose(exc: BaseException, security: KafkaSecurity, where: str) -> str | None:
    """The one-line cause of a failed connection, or None when it is a network problem."""
    text = _chain_text(exc)
    low = text.lower()
    if any(n in low for n in _NETWORK):
        return None
    if "certificate_verify_failed" in low or "certificate verify failed" in low:
        if "mismatch" in low:
            return (
                f"Kafka TLS handshake with {where} failed: the broker certificate does not name "
                "this host; connect with a name the certificate holds (--kafka-bootstrap), or "
                "switch hostname verification off with --kafka-ssl-no-check-hostname"
            )
        if "expired" in low:
            return f"Kafka TLS handshake with {where} failed: the broker certificate has expired"
        reason = text.split("certificate verify failed:", 1)[-1].split("(_ssl", 1)[0].strip()
        return (
            f"Kafka TLS handshake with {where} failed: certificate not trusted ({reason}); "
            "check --kafka-ssl-cafile"
        )
    if "wrong_version_number" in low or (not security.uses_tls and "reset by peer" in low):
        return (
            f"Kafka broker {where} and ragpulse disagree about TLS; check "
            f"--kafka-security-protocol (now {security.protocol}) and the port"
        )
    if security.uses_tls and any(
        m in low for m in ("eof occurred", "certificate required", "bad_certificate",
                           "unknown_ca", "handshake_failure", "certificate_unknown")
    ):
        return (
            f"Kafka TLS handshake with {where} failed: the broker closed the connection; it "
            "requires a client certificate it trusts (check --kafka-ssl-certfile and "
            "--kafka-ssl-keyfile), or does not speak TLS on this port (check "
            "--kafka-security-protocol)"
        )
    if "unsupportedsaslmechanism" in low:
        return (
            f"Kafka broker {where} does not offer SASL {security.sasl_mechanism}; check "
            "--kafka-sasl-mechanism"
        )
    if security.uses_sasl:
        if security.sasl_mechanism == "OAUTHBEARER":
            check = "the token in --kafka-sasl-oauth-token-file"
        else:
            check = (
                f"--kafka-sasl-username ({security.sasl_username}) and the password "
                f"(--kafka-sasl-password-file or {ENV_SASL_PASSWORD})"
            )
        return (
            f"Kafka SASL {security.sasl_mechanism} authentication with {where} failed "
            f"({type(exc).__name__}); check {check}"
        )
    return None


def _chain_text(exc: BaseException) -> str:
    parts: list[str] = []
    seen: set[int] = set()
    todo: list[object] = [exc]
    while todo:
        item = todo.pop()
        if id(item) in seen or not isinstance(item, BaseException):
            continue
        seen.add(id(item))
        parts.append(f"{type(item).__name__}: {item}")
        todo.extend([item.__cause__, item.__context__, *item.args])
    return " | ".join(parts)


def security_from(
    flags: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> KafkaSecurity:
    """KafkaSecurity from the `--kafka-*` flags' values (by the keys of
    `pipeline.settings.blocks.kafka_security`), over the properties file, over the defaults;
    validated."""
    env = os.environ if env is None else env
    props: dict[str, Any] = {}
    if flags["properties"] is not None:
        props = read_properties(flags["properties"])
    given: dict[str, Any] = {
        "protocol": flags["protocol"],
        "ssl_cafile": flags["ssl_cafile"],
        "ssl_certfile": flags["ssl_certfile"],
        "ssl_keyfile": flags["ssl_keyfile"],
        "ssl_crlfile": flags["ssl_crlfile"],
        "ssl_check_hostname": False if flags["ssl_no_check_hostname"] else None,
        "sasl_mechanism": flags["sasl_mechanism"],
        "sasl_username": flags["sasl_username"] or env.get(ENV_SASL_USERNAME),
        "sasl_oauth_token_file": flags["sasl_oauth_token_file"],
    }
    sasl_password = _secret(
        flags["sasl_password_file"], "--kafka-sasl-password-file", env, ENV_SASL_PASSWORD
    )
    key_password = _secret(
        flags["ssl_key_password_file"], "--kafka-ssl-key-password-file", env,
        ENV_SSL_KEY_PASSWORD,
    )
    merged = {**props, **{k: v for k, v in given.items() if v is not None}}
    if sasl_password is not None:
        merged["sasl_password"] = sasl_password
    if key_password is not None:
        merged["ssl_key_password"] = key_password
    return validate(KafkaSecurity(**merged))


def _secret(path: Path | None, flag: str, env: Mapping[str, str], var: str) -> SecretStr | None:
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise KafkaSecurityError(f"{flag} {path}: cannot read ({exc.strerror})") from None
        # One trailing newline is what `echo` and editors add; it is not part of the secret.
        value = text[:-1] if text.endswith("\n") else text
        value = value[:-1] if value.endswith("\r") else value
        if not value:
            raise KafkaSecurityError(f"{flag} {path} is empty")
        return SecretStr(value)
    if env.get(var):
        return SecretStr(env[var])
    return None


def validate(s: KafkaSecurity) -> KafkaSecurity:
    """Reject combinations that cannot work, naming the flag; check that files exist."""
    tls_flags = {
        "--kafka-ssl-cafile": s.ssl_cafile,
        "--kafka-ssl-certfile": s.ssl_certfile,
        "--kafka-ssl-keyfile": s.ssl_keyfile,
        "--kafka-ssl-crlfile": s.ssl_crlfile,
    }
    if not s.uses_tls:
        given = [flag for flag, value in tls_flags.items() if value is not None]
        if given:
            raise KafkaSecurityError(
                f"{', '.join(given)} given, but --kafka-security-protocol is {s.protocol}: use "
                "SSL or SASL_SSL to connect with TLS"
            )
    for flag, value in [*tls_flags.items(), ("--kafka-sasl-oauth-token-file",
                                             s.sasl_oauth_token_file)]:
        if value is not None and not value.is_file():
            raise KafkaSecurityError(f"{flag} {value}: no such file")
    if s.ssl_keyfile is not None and s.ssl_certfile is None:
        raise KafkaSecurityError("--kafka-ssl-keyfile needs --kafka-ssl-certfile")
    if s.uses_tls:
        s.ssl_context()  # a bad CA bundle or key fails here, at start-up
    if not s.uses_sasl:
        if s.sasl_mechanism is not None:
            raise KafkaSecurityError(
                f"--kafka-sasl-mechanism {s.sasl_mechanism} given, but --kafka-security-protocol "
                f"is {s.protocol}: use SASL_SSL (or SASL_PLAINTEXT)"
            )
        return s
    if s.sasl_mechanism is None:
        raise KafkaSecurityError(
            f"--kafka-security-protocol {s.protocol} needs --kafka-sasl-mechanism "
            f"({', '.join(MECHANISMS)})"
        )
    if s.sasl_mechanism == "OAUTHBEARER":
        if s.sasl_oauth_token_file is None:
            raise KafkaSecurityError("SASL OAUTHBEARER needs --kafka-sasl-oauth-token-file")
    else:
        if not s.sasl_username:
            raise KafkaSecurityError(
                f"SASL {s.sasl_mechanism} needs a user: --kafka-sasl-username or "
                f"{ENV_SASL_USERNAME}"
            )
        if s.sasl_password is None:
            raise KafkaSecurityError(
                f"SASL {s.sasl_mechanism} needs a password: --kafka-sasl-password-file or "
                f"{ENV_SASL_PASSWORD}"
            )
    if s.protocol == "SASL_PLAINTEXT":
        log.warning("Kafka SASL over SASL_PLAINTEXT: credentials and data cross the network "
                    "unencrypted; use SASL_SSL outside a trusted network")
    return s


# ----- Java-style client properties ---------------------------------------------------------

_JAAS = re.compile(
    r"^\s*(?P<module>[\w.$]+)\s+required\b(?P<options>.*?);?\s*$", re.DOTALL
)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+?))(?=\s|;|$)')
_JAAS_MODULES = {
    "org.apache.kafka.common.security.plain.PlainLoginModule": ("PLAIN",),
    "org.apache.kafka.common.security.scram.ScramLoginModule": (
        "SCRAM-SHA-256", "SCRAM-SHA-512",
    ),
}


def read_properties(path: Path) -> dict[str, Any]:
    """The KafkaSecurity fields a Java client properties file sets; unknown keys are errors.

    Lines are `key=value` (or `key: value`); `#` and `!` start comments; a trailing backslash
    continues a line. kafka-python reads PEM files only, so JKS/PKCS12 stores are rejected with
    a hint to convert them.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KafkaSecurityError(
            f"--kafka-properties {path}: cannot read ({exc.strerror})"
        ) from None
    entries = _parse_properties(text)
    where = f"--kafka-properties {path}"
    fields: dict[str, Any] = {}
    types = {k: entries.pop(k).upper() for k in ("ssl.truststore.type", "ssl.keystore.type")
             if k in entries}
    for store_key, store in types.items():
        if store != "PEM":
            raise KafkaSecurityError(
                f"{where}: {store_key} other than PEM is not supported: kafka-python reads PEM "
                "files only; convert the store to PEM (keytool -exportcert -rfc, openssl pkcs12 "
                f"-nodes) and set {store_key}=PEM"
            )
    for key, value in entries.items():
        if key == "security.protocol":
            if value.upper() not in PROTOCOLS:
                raise KafkaSecurityError(f"{where}: security.protocol is not one of "
                                         f"{', '.join(PROTOCOLS)} {NOT_SHOWN}")
            fields["protocol"] = value.upper()
        elif key == "sasl.mechanism":
            if value.upper() not in MECHANISMS:
                raise KafkaSecurityError(
                    f"{where}: sasl.mechanism is not supported {NOT_SHOWN} (ragpulse supports "
                    f"{', '.join(MECHANISMS)})"
                )
            fields["sasl_mechanism"] = value.upper()
        elif key == "sasl.jaas.config":
            fields.update(_jaas_credentials(value, where))
        elif key in ("ssl.truststore.location", "ssl.keystore.location"):
            store_type = key.replace(".location", ".type")
            if store_type not in types:
                raise KafkaSecurityError(
                    f"{where}: {key} needs {store_type}=PEM (kafka-python reads PEM files only)"
                )
            fields["ssl_cafile" if "truststore" in key else "ssl_certfile"] = Path(value)
        elif key == "ssl.key.password":
            fields["ssl_key_password"] = SecretStr(value)
        elif key == "ssl.endpoint.identification.algorithm":
            if value.lower() not in ("", "https"):
                raise KafkaSecurityError(f"{where}: {key}: expected https or empty {NOT_SHOWN}")
            fields["ssl_check_hostname"] = value.lower() == "https"
        elif key == "bootstrap.servers":
            raise KafkaSecurityError(
                f"{where}: bootstrap.servers is set with --kafka-bootstrap; remove it from the file"
            )
        else:
            raise KafkaSecurityError(
                f"{where}: unknown or unsupported key {key!r}; ragpulse takes security.protocol, "
                "sasl.mechanism, sasl.jaas.config (Plain/Scram login modules), "
                "ssl.truststore.location/type, ssl.keystore.location/type, ssl.key.password and "
                "ssl.endpoint.identification.algorithm"
            )
    return fields


def _parse_properties(text: str) -> dict[str, str]:
    entries: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = pending + raw.strip() if pending else raw.strip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        pending = ""
        if not line or line[0] in "#!":
            continue
        match = re.match(r"([^=:\s]+)\s*[=:]\s*(.*)$", line)
        if match is None:
            # The line is not quoted: it may hold a password.
            raise KafkaSecurityError(f"--kafka-properties: line {number} is not key=value")
        entries[match[1]] = match[2]
    return entries


def _jaas_credentials(value: str, where: str) -> dict[str, Any]:
    match = _JAAS.match(value)
    if match is None or match["module"] not in _JAAS_MODULES:
        module = match["module"] if match else value.split(" ", 1)[0]
        raise KafkaSecurityError(
            f"{where}: sasl.jaas.config login module {module!r} is not supported; ragpulse takes "
            "PlainLoginModule and ScramLoginModule credentials (for OAUTHBEARER use "
            "--kafka-sasl-oauth-token-file)"
        )
    options = {
        m[1]: (m[2].replace('\\"', '"') if m[2] is not None else m[3])
        for m in _JAAS_OPTION.finditer(match["options"])
    }
    missing = [k for k in ("username", "password") if k not in options]
    if missing:
        raise KafkaSecurityError(f"{where}: sasl.jaas.config has no {' or '.join(missing)}")
    return {"sasl_username": options["username"], "sasl_password": SecretStr(options["password"])}
