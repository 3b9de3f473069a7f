"""The flags of the values a lower layer defines: the judge cascade and budget (costs/), the label
limits (metrics/labels.py) and Kafka security (kafka_security.py). Those modules keep the logic
and receive the built value; the flags, their defaults and the checks that name a flag are here.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ragpulse.pipeline.costs.budget import BudgetSettings, load_prices
from ragpulse.pipeline.costs.cascade import CascadeSettings
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.kafka_security import (
    ENV_SASL_PASSWORD,
    ENV_SASL_USERNAME,
    ENV_SSL_KEY_PASSWORD,
    MECHANISMS,
    PROTOCOLS,
    KafkaSecurity,
    security_from,
)
from ragpulse.pipeline.metrics.labels import LabelLimits
from ragpulse.pipeline.settings.flags import Block, Flag, unit_interval

# --- the judge cascade (run, serve) -----------------------------------------------------------


def _cascade(values: dict[str, Any], fields: dict[str, Any]) -> CascadeSettings | None:
    """None without --cascade-llm-sample-rate; SettingsError when the judges cannot run as a
    cascade."""
    if values["llm_sample_rate"] is None:
        return None
    judges = fields["judges"]
    if judges.backend != "openai":
        raise SettingsError(
            "--cascade-llm-sample-rate needs --judge-backend openai: the cascade sends events "
            "from the local judges to the LLM ones"
        )
    from ragpulse.judges.local.judge import build_local_judges

    try:
        build_local_judges(judges.names)
    except ValueError as exc:
        raise SettingsError(f"--cascade-llm-sample-rate: {exc}; the cascade runs both") from None
    return CascadeSettings(values["llm_sample_rate"], values["uncertainty_band"])


CASCADE = Block("cascade", (
    Flag(
        "--cascade-llm-sample-rate", "llm_sample_rate", group="judge cascade",
        type=unit_interval, default=None, metavar="RATE",
        help="turn on the judge cascade (with --judge-backend openai): the local judges grade "
        "every event, the LLM judges this share of them and the ones the local judges are "
        "unsure of; verdicts are the LLM's where it ran (default: no cascade)",
    ),
    Flag(
        "--cascade-uncertainty-band", "uncertainty_band", group="judge cascade",
        type=unit_interval, default=0.1, metavar="MARGIN",
        help="send an event to the LLM when a local judge's rating is within this margin of "
        "its threshold (groundedness, relevance_to_query) (default: %(default)s)",
    ),
), _cascade)


# --- the judge budget (serve) -----------------------------------------------------------------


def _budget(values: dict[str, Any], fields: dict[str, Any]) -> BudgetSettings | None:
    """None without --judge-budget-per-hour; SettingsError if unusable."""
    judges = fields["judges"]
    if values["per_hour"] is None:
        if values["price_table"] is not None:
            raise SettingsError("--judge-price-table needs --judge-budget-per-hour")
        return None
    if judges.backend == "local":
        raise SettingsError(
            "--judge-budget-per-hour limits LLM judge spend; --judge-backend local spends nothing"
        )
    prices = None
    if values["price_table"] is not None:
        prices = load_prices(values["price_table"], judges.model)
    return BudgetSettings(values["per_hour"], values["min_sample_rate"], prices)


def _positive(text: str) -> float:
    value = float(text)
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


BUDGET = Block("budget", (
    Flag(
        "--judge-budget-per-hour", "per_hour", group="judge budget",
        type=_positive, default=None, metavar="N",
        help="judge spend allowed per clock hour: tokens, or money with --judge-price-table; "
        "the sample rate of every stratum is lowered for the rest of the hour when the next "
        "cycle would exceed it, and verdicts are weighted by 1 / rate (default: no budget)",
    ),
    Flag(
        "--judge-min-sample-rate", "min_sample_rate", group="judge budget",
        type=unit_interval, default=0.01, metavar="RATE",
        help="the budget never lowers a stratum's sample rate below this (default: %(default)s)",
    ),
    Flag(
        "--judge-price-table", "price_table", group="judge budget",
        type=Path, default=None, metavar="FILE",
        help="YAML prices per million tokens by judge model, e.g. 'gpt-4o-mini: {prompt: 0.15, "
        "cached_prompt: 0.075, completion: 0.6}': the budget is then money (default: tokens)",
    ),
), _budget)


# --- the label limits (run, serve, exporter) --------------------------------------------------

DEFAULT_LABEL_LIMITS = LabelLimits(max_values=100)


def _labels(values: dict[str, Any], fields: dict[str, Any]) -> LabelLimits:
    allowed = {
        label: values[f"allowed_{label}s"]
        for label in ("app", "model", "guideline")
        if values[f"allowed_{label}s"] is not None
    }
    return LabelLimits(max_values=values["max_values"], allowed=allowed)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _value_set(text: str) -> frozenset[str]:
    values = frozenset(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError("must name at least one value")
    return values


def _allowed(label: str, metavar: str, what: str = "") -> Flag:
    return Flag(
        f"--allowed-{label}s", f"allowed_{label}s", group="labels",
        type=_value_set, default=None, metavar=metavar,
        help=f"the only {label} label values exported{what}; others are counted as 'other'",
    )


LABELS = Block("labels", (
    Flag(
        "--max-label-values", "max_values", group="labels",
        type=_positive_int, default=DEFAULT_LABEL_LIMITS.max_values, metavar="N",
        help="most distinct values of the app, the model and the guideline label in metrics; "
        "later new values are counted as 'other' (default: %(default)s)",
    ),
    _allowed("app", "A,B,..."),
    _allowed("model", "M,N,..."),
    _allowed("guideline", "G,H,...", " (names of the events' named guidelines)"),
), _labels)


# --- Kafka security (serve, stream's publishers, exporter, simulate) --------------------------


def _security(values: dict[str, Any], fields: dict[str, Any]) -> KafkaSecurity:
    return security_from(values)


# The TLS files a client may be given, in the order --help lists them.
_SSL_FILES = (
    ("cafile",
     "PEM CA bundle that signed the brokers' certificates (default: system trust store)"),
    ("certfile", "PEM client certificate, for brokers that require one (mutual TLS)"),
    ("keyfile",
     "PEM private key of the client certificate (default: inside --kafka-ssl-certfile)"),
    ("key-password-file",
     f"file holding the password of an encrypted key (or env {ENV_SSL_KEY_PASSWORD})"),
    ("crlfile",
     "PEM certificate revocation list to check the broker certificate against"),
)


def kafka_security(group: str) -> Block:
    """The `--kafka-*` security flags (secrets only as files), in the --help `group`. The block
    has no model: a flag not given is None, and `security_from` takes the value from the
    properties file or KafkaSecurity's default."""
    flags = (
        Flag(
            "--kafka-properties", "properties", type=Path, metavar="FILE",
            help="Java-style Kafka client properties (security.protocol, sasl.mechanism, "
            "sasl.jaas.config, ssl.truststore.location with ssl.truststore.type=PEM, ...); "
            "flags override it",
        ),
        Flag(
            "--kafka-security-protocol", "protocol", choices=PROTOCOLS,
            help="PLAINTEXT (default), SSL, SASL_PLAINTEXT or SASL_SSL",
        ),
        *(
            Flag(f"--kafka-ssl-{name}", "ssl_" + name.replace("-", "_"), type=Path,
                 metavar="FILE", help=help)
            for name, help in _SSL_FILES
        ),
        Flag(
            "--kafka-ssl-no-check-hostname", "ssl_no_check_hostname", action="store_true",
            default=None,  # unset: the properties file, else KafkaSecurity, decides
            help="do not check that the broker certificate names the host connected to (on by "
            "default; switching it off allows man-in-the-middle attacks)",
        ),
        Flag(
            "--kafka-sasl-mechanism", "sasl_mechanism", choices=MECHANISMS,
            help="SASL mechanism with SASL_PLAINTEXT / SASL_SSL",
        ),
        Flag(
            "--kafka-sasl-username", "sasl_username",
            help=f"SASL user for PLAIN and SCRAM (or env {ENV_SASL_USERNAME})",
        ),
        Flag(
            "--kafka-sasl-password-file", "sasl_password_file", type=Path, metavar="FILE",
            help=f"file holding the SASL password (or env {ENV_SASL_PASSWORD}); never a flag, "
            "so it does not show in process lists",
        ),
        Flag(
            "--kafka-sasl-oauth-token-file", "sasl_oauth_token_file", type=Path,
            metavar="FILE",
            help="OAUTHBEARER: file holding the access token, re-read whenever it changes",
        ),
    )
    return Block("kafka_security", tuple(f.in_group(group) for f in flags), _security)
