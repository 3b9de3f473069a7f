"""Each command's flags: the blocks run, serve and stream share (judges, events, conversations,
Beam), and every command's `FlagTable`, in the order --help shows them.

A flag's default is its settings field's (pipeline.settings.models); the values of a lower
layer (cascade, budget, label limits, Kafka security) are in pipeline.settings.blocks.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

from ragpulse.judges import DEFAULT_JUDGES
from ragpulse.judges.redaction import REDACT_MODES, STORE_TEXT_MODES
from ragpulse.judges.registry import SESSION_JUDGES, judges_help
from ragpulse.pipeline.errors import EXIT_OFFSET_RESET, SettingsError
from ragpulse.pipeline.formats.otlp import INPUT_FORMATS
from ragpulse.pipeline.kafka_security import PLAINTEXT, KafkaSecurity, security_from
from ragpulse.pipeline.settings.blocks import BUDGET, CASCADE, LABELS, kafka_security
from ragpulse.pipeline.settings.flags import (
    Block,
    Flag,
    FlagTable,
    M,
    add_flags,
    comma_list,
    duration,
    duration_flag,
    fields_from_flags,
    joined,
    unit_interval,
    values_of,
)
from ragpulse.pipeline.settings.models import (
    BATCH_EVENTS_PER_CALL,
    MIN_BATCH_EVENTS,
    REFUSED_RUNNERS,
    RUNNERS,
    SIMULATED_TOOLS,
    STREAM_RUNNERS,
    AlignSettings,
    CalibrateSettings,
    ExplainSettings,
    ExporterSettings,
    ImportLabelsSettings,
    JudgeSettings,
    ReviewSettings,
    RunSettings,
    ServeSettings,
    SimulateSettings,
    StreamSettings,
    WindowsSettings,
    build,
    judge_settings_from,
)
from ragpulse.pipeline.sinks import DEAD_LETTER_FILE, METRICS_FILE, VERDICTS_FILE, WINDOWS_FILE

# The Java Kafka reader's expansion service, and the installed Beam's version, read without
# importing Beam: the flags (and a refused flag's one-line error) should not wait the seconds
# that import takes. ragpulse's Kafka read (java/kafka-read, `make kafka-read-jar`) must be on
# the expansion service's classpath; deploy/flink/jobserver.yaml and deploy/dataflow/launch.py
# run it (docs/operations.md, "The Kafka read on Flink", says why the reads differ).
EXPANSION_JAR = "beam-sdks-java-io-expansion-service-{version}.jar"
BEAM_VERSION = version("apache-beam")
START_EXPANSION_SERVICE = (
    f"java -cp {EXPANSION_JAR.format(version=BEAM_VERSION)}:ragpulse-kafka-read.jar "
    "org.apache.beam.sdk.expansion.service.ExpansionService PORT, "
    "with --experiments=use_deprecated_read for Flink, without it for Dataflow"
)

def settings_from(table: FlagTable[M], args: argparse.Namespace) -> M:
    """The table's settings model from the parsed flags; SettingsError says what is wrong."""
    if table.model is None:
        raise ValueError("this table sets no settings model")
    return build(table.model, table.flag_names(), **fields_from_flags(table, args))


# --- the judges (run, serve, stream, calibrate) -----------------------------------------------


def _judge_flags(one_judge: bool) -> tuple[Flag, ...]:
    g = "judges"
    if one_judge:
        names = Flag(
            "--judge", "names", group=g, dest="judges", required=True, metavar="NAME",
            read=comma_list, help=f"the judge to run, one of: {judges_help()}",
        )
    else:
        names = Flag(
            "--judges", "names", group=g, text=joined, read=comma_list,
            help=f"comma-separated judges to run, each once, from: {judges_help()} "
            f"(default: {','.join(DEFAULT_JUDGES)})",
        )
    return (
        names,
        Flag(
            "--judge-backend", "backend", group=g, choices=["local", "openai"],
            help="local: offline lexical judges, no network. openai: LLM judges through the "
            "openai client. Default: openai when --judge-base-url, OPENAI_BASE_URL or "
            "OPENAI_API_KEY is set, else local (the choice is logged).",
        ),
        Flag(
            "--judge-base-url", "base_url", group=g,
            help="OpenAI-compatible endpoint, e.g. http://localhost:8000/v1 (vLLM, Ollama, "
            "Azure OpenAI, ...); default $OPENAI_BASE_URL, else api.openai.com. The key comes "
            "from $OPENAI_API_KEY and is never logged.",
        ),
        Flag("--judge-model", "model", group=g, help="judge model name (default: %(default)s)"),
        Flag(
            "--judge-concurrency", "concurrency", group=g, type=int,
            help="LLM calls in flight at once (default: %(default)s)",
        ),
        duration_flag(
            "--judge-timeout", "timeout_seconds", group=g,
            help="timeout of one LLM call, e.g. 30s (default: {default})",
        ),
        Flag(
            "--judge-max-retries", "max_retries", group=g, type=int,
            help="retries of an LLM call on 429, 5xx, timeouts and connection errors "
            "(default: %(default)s)",
        ),
        Flag(
            "--custom-judge", "custom_judges", group=g, action="append", type=Path,
            metavar="FILE",
            help="a custom LLM judge defined in YAML: the keys of a shipped prompt file (name, "
            "version, ratings, inputs, task, rubric, one example or more per rating) plus "
            "requires and when_missing; run it by adding its name to --judges (openai "
            "backend; repeatable)",
        ),
        Flag(
            "--judge-prompts", "prompts_dir", group=g, type=Path, metavar="DIR",
            help="folder of LLM judge prompt files (<judge>.yaml) replacing the shipped ones, "
            "e.g. a mounted ConfigMap (default: the files in judges/prompts/)",
        ),
        Flag(
            "--judge-temperature", "temperature", group=g, type=float,
            help="sampling temperature of LLM judges (default: %(default)s)",
        ),
        Flag(
            "--judge-reply-format", "reply_format", group=g,
            choices=["json_schema", "json_object", "text"],
            help="the response_format LLM judges ask for: json_schema (the verdict schema, "
            "strict; OpenAI, vLLM), json_object (any JSON object, for servers without "
            "json_schema) or text (no response_format; the rationale:/rating: lines of the "
            "prompt are read) (default: %(default)s)",
        ),
        Flag(
            "--judge-max-tokens", "max_tokens", group=g, type=int, metavar="N",
            help="cap on each LLM judge reply (max_tokens); a reply cut off there is an error "
            "with cause truncated (default: %(default)s; a one-sentence verdict takes well "
            "under 100)",
        ),
        Flag(
            "--judge-breaker-failures", "breaker_failures", group=g, type=int, metavar="N",
            help="open the judge endpoint's circuit breaker after N failed requests in a row "
            "(timeouts, 5xx, 429, connection errors); while open, calls fail at once with "
            "cause circuit_open. 0 turns the breaker off (default: %(default)s)",
        ),
        duration_flag(
            "--judge-breaker-cooldown", "breaker_cooldown_seconds", group=g,
            help="how long the breaker stays open before one probe call tests the endpoint "
            "again (default: {default})",
        ),
        duration_flag(
            "--judge-batch-deadline", "batch_deadline_seconds", group=g,
            help="most time one batch of events may spend being judged; calls still pending "
            "then are cancelled (cause deadline), and no retry or Retry-After wait past it is "
            f"taken. Keep it above batch events ({MIN_BATCH_EVENTS}, or {BATCH_EVENTS_PER_CALL}"
            " x --judge-concurrency) x judges / concurrency x call latency "
            "(default: {default})",
        ),
        Flag(
            "--judge-rpm", "rpm", group=g, type=int, metavar="N",
            help="requests per minute the judge endpoint allows (its quota); calls are paced "
            "to stay under it (default: no limit)",
        ),
        Flag(
            "--judge-tpm", "tpm", group=g, type=int, metavar="N",
            help="tokens per minute the judge endpoint allows; each call is estimated before "
            "it is sent (characters / 4 + --judge-max-tokens) and corrected by the usage "
            "reported (default: no limit)",
        ),
        Flag(
            "--judge-cache-size", "cache_size", group=g, type=int, metavar="N",
            help="LLM judge verdicts kept so that an input identical to one already judged "
            "(same judge, prompt version, model and event text) is not sent again within "
            "--judge-cache-ttl; errors are never kept. 0 turns the cache off; the local judges "
            "have none (they grade faster than a lookup) (default: %(default)s)",
        ),
        duration_flag(
            "--judge-cache-ttl", "cache_ttl_seconds", group=g,
            help="how long a kept verdict is given again for an identical input "
            "(default: {default})",
        ),
        Flag(
            "--judge-score-threshold", "score_threshold", group=g, type=float,
            metavar="SCORE",
            help="the scored judges (faithfulness: share of the answer's claims the context "
            "supports; answer_correctness: claim F1 against the expected answer) rate yes at "
            "this score (0..1) or above (default: %(default)s)",
        ),
        Flag(
            "--judge-embeddings-model", "embeddings_model", group=g, metavar="NAME",
            help="answer_correctness blends its claim F1 (0.75) with the cosine similarity "
            "(0.25) of the answer's and the expected answer's embeddings from this model, "
            "asked at the judge endpoint's /embeddings (default: off)",
        ),
        Flag(
            "--judge-combine", "combine", group=g, action="store_true",
            help="grade the LLM judges that read the same event (groundedness, "
            "relevance_to_query, safety and custom judges of the answer) in one call per "
            "event: the chunks are sent once; a reply lacking one judge's verdict makes that "
            "verdict an error",
        ),
        Flag(
            "--judge-logprobs", "logprobs", group=g, action="store_true",
            help="ask the endpoint for token log-probabilities: a yes/no verdict then carries "
            "P(yes) as its score (a graded one its expected score), exported as "
            "ragpulse_judge_score and used by the cascade and calibrate; an endpoint that "
            "returns none gives verdicts as without the flag",
        ),
        Flag(
            "--redact-pii", "redact_pii", group=g, choices=REDACT_MODES,
            help="replace e-mails, phone, card and IBAN numbers, IP addresses and API keys "
            "with [EMAIL], [PHONE] ... in LLM judge prompts. auto: on unless "
            "--judge-endpoint-trusted (default: %(default)s)",
        ),
        Flag(
            "--judge-endpoint-trusted", "endpoint_trusted", group=g, action="store_true",
            help="the judge endpoint keeps prompts where the users' text may go (e.g. a model "
            "served on this machine, not a proxy to a hosted one): --redact-pii auto then "
            "sends raw text",
        ),
        Flag(
            "--redact-pattern", "redact_patterns", group=g, action="append", metavar="REGEX",
            help="also replace matches of this Python regex with [REDACTED] (repeatable); "
            "used for prompts and stored text",
        ),
        Flag(
            "--guideline", "guidelines", group=g, action="append", metavar="NAME=RULE",
            help="a guideline every answer must follow, checked by the guideline_adherence "
            "judge with the event's own `guidelines` (repeatable; rules with one NAME form one "
            "set), e.g. --guideline 'english=The response must be in English'",
        ),
        Flag(
            "--composite", "composites", group=g, action="append",
            metavar="NAME=JUDGE:WEIGHT,...",
            help="a weighted composite of the judges' grades, exported like a judge on a "
            "graded scale: each member's grade on 0..1 (yes 1, no 0; a 0-3 or 1-5 score "
            "scaled), their weighted mean passes at pass:SCORE (default 0.5) (repeatable), "
            "e.g. --composite quality=correctness:0.6,comprehensiveness:0.2,readability:0.2",
        ),
        Flag(
            "--ensemble", "ensembles", group=g, action="append",
            metavar="JUDGE=MODEL,MODEL,MODEL",
            help="grade JUDGE by the majority of an odd number (>= 3) of models on the "
            "endpoint, or JUDGE=N: N samples of --judge-model; agreement counted in "
            "ragpulse_judge_ensemble_votes_total (repeatable; openai backend)",
        ),
        Flag(
            "--store-text", "store_text", group=g, choices=STORE_TEXT_MODES,
            help="what verdict rows keep of judge rationales and error messages, which can "
            "quote the answer: full, redacted (PII replaced) or none (ratings only) "
            "(default: %(default)s)",
        ),
    )


def _judges(values: dict[str, Any], fields: dict[str, Any]) -> JudgeSettings:
    return judge_settings_from(values, flag_names=JUDGES.flag_names())


def _one_judge(values: dict[str, Any], fields: dict[str, Any]) -> JudgeSettings:
    judges = judge_settings_from(values, flag_names=ONE_JUDGE.flag_names())
    if len(judges.names) != 1:
        raise SettingsError(f"--judge: one judge, not {', '.join(judges.names)}")
    return judges


JUDGES = Block("judges", _judge_flags(one_judge=False), _judges, JudgeSettings)
# calibrate's: --judge NAME instead of --judges.
ONE_JUDGE = Block("judges", _judge_flags(one_judge=True), _one_judge, JudgeSettings)


def add_judge_arguments(parser: argparse.ArgumentParser) -> None:
    """The judge flags alone (tests, and tools that build a panel from flags)."""
    add_flags(parser, FlagTable(None, (JUDGES,)))


def judge_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> JudgeSettings:
    """Judge settings from the judge flags and the environment (see `judge_settings_from`)."""
    return judge_settings_from(
        values_of(JUDGES.flags, args), os.environ if env is None else env, JUDGES.flag_names()
    )


# --- events, sampling, conversations, Beam (run, serve, stream) -------------------------------

_EVENTS = "events and windows"
FUTURE_SKEW = duration_flag(
    "--max-future-skew", "max_future_skew_seconds", group=_EVENTS,
    help="events dated more than this ahead of their Kafka record time or the clock are "
    "dead-lettered as future-dated, so that one wrong clock cannot move the watermark to the "
    "future (default: {default})",
)
EVENTS = (
    Flag(
        "--sample-rate", "sample_rate", group=_EVENTS, type=unit_interval,
        help="share of events judged, chosen by a hash of request_id (default: %(default)s)",
    ),
    duration_flag(
        "--window", "window_seconds", group=_EVENTS,
        help="event-time window size, e.g. 60s, 5m, 1h (default: {default})",
    ),
    Flag(
        "--max-event-bytes", "max_event_bytes", group=_EVENTS, type=int, metavar="N",
        help="largest accepted event; larger ones are dead-lettered (default: %(default)s)",
    ),
    FUTURE_SKEW,
)
JUDGE_CALIBRATION = Flag(
    "--judge-calibration", "judge_calibrations", group="judge calibration",
    action="append", type=Path, metavar="FILE",
    help="a judge's sensitivity and specificity on human labels, as `ragpulse calibrate "
    "--output FILE` wrote them (one file per judge, repeatable): the judge's windows also "
    "get the pass ratio corrected for its errors, with a 95 %% interval "
    "(ragpulse_judge_pass_ratio_corrected*, windows.jsonl corrected_*); serve and the exporter add "
    "reviewers' labels of the random review slice to its counts (default: none)",
)
# What `run` and `serve` read besides EVENTS (`stream` reads none of these, so it takes none).
BATCH = (
    *EVENTS,
    Flag(
        "--sampling-rules", "sampling", group=_EVENTS, type=Path, metavar="FILE",
        help="YAML rules sampling strata of events at their own rates (e.g. every event with "
        "negative feedback, 5%% of the rest); judged events are weighted by 1 / rate in "
        "ragpulse_judge_verdicts_weighted_total (see pipeline/costs/sampling.py) "
        "(default: none)",
    ),
    CASCADE,
    JUDGE_CALIBRATION,
    Flag(
        "--input-format", "input_format", group=_EVENTS, choices=INPUT_FORMATS,
        help="ragpulse: one inference-log event per record; otlp_json, otlp_proto: one "
        "OpenTelemetry ExportTraceServiceRequest per record, as the Collector's Kafka exporter "
        "publishes with that encoding (a file: OTLP JSON lines, or length-prefixed protobuf), "
        "assembled into one answer per trace (default: %(default)s)",
    ),
)

_SESSIONS = "conversations (events with a session_id)"
SESSIONS = (
    Flag(
        "--session-judges", "session_judges", group=_SESSIONS, metavar="NAMES",
        text=joined, read=comma_list,
        help="comma-separated session judges, each grading a whole conversation once: "
        + ", ".join(f"{n} ({', '.join(e.backends)})" for n, e in SESSION_JUDGES.items())
        + ", or a --custom-judge with assessment: SESSION (default: none)",
    ),
    duration_flag(
        "--session-gap", "session_gap_seconds", group=_SESSIONS,
        help="a conversation is over, and judged, once no turn came for this long in event "
        "time (Beam session windows) (default: {default})",
    ),
    Flag(
        "--session-max-turns", "session_max_turns", group=_SESSIONS, type=int, metavar="N",
        help="a longer conversation is judged on its last N turns and counted in "
        "ragpulse_sessions_truncated_total (default: %(default)s)",
    ),
    Flag(
        "--session-max-bytes", "session_max_bytes", group=_SESSIONS, type=int, metavar="N",
        help="likewise for the bytes of a conversation's text (default: %(default)s)",
    ),
)

_REVIEW = "review queue (docs/review.md; off unless --review-rate > 0)"
REVIEW = (
    Flag(
        "--review-rate", "review_rate", group=_REVIEW, type=unit_interval,
        help="share of judged events published to the review topic as a uniform random slice "
        "(a hash of request_id), with the targeted items below, for `ragpulse review`; the "
        "items hold the request, response and chunks (redacted as judge prompts are, "
        "--redact-pii) and rationales (as --store-text allows): a copy of users' text on a new "
        "topic (default: %(default)s, no review queue)",
    ),
    Flag(
        "--review-targets", "review_targets", group=_REVIEW, metavar="REASONS",
        text=joined, read=comma_list,
        help="targeted items queued besides the random slice, kept out of error-rate "
        "estimates: disagreement (the cascade's tiers disagreed), unsure (P(yes) near 0.5, "
        "--judge-logprobs), failing (a judge said no); comma-separated (default: %(default)s)",
    ),
    Flag(
        "--review-unsure-band", "review_unsure_band", group=_REVIEW, type=float, metavar="D",
        help="an `unsure` verdict has P(yes) within D of 0.5 (default: %(default)s)",
    ),
    Flag(
        "--review-max-per-hour", "review_max_per_hour", group=_REVIEW, type=int, metavar="N",
        help="at most N items queued per hour of event time (per process), targeted ones at "
        "most half; "
        "the rest counted in ragpulse_review_held_back_total (default: %(default)s)",
    ),
    Flag(
        "--review-topic", "review_topic", group=_REVIEW,
        help="the review topic (default: TOPIC.review)",
    ),
)

BEAM = (
    Flag(
        "--runner", "runner", group="beam", metavar="NAME",
        help=f"the Beam runner: {', '.join(RUNNERS)}; its options with --beam-arg, e.g. "
        "--runner PortableRunner --beam-arg=--job_endpoint=HOST:PORT. Refused: "
        + "; ".join(f"{name} ({why})" for name, why in REFUSED_RUNNERS.items())
        + " (default: Beam's FnApiRunner in this process)",
    ),
    Flag(
        "--beam-arg", "beam_args", group="beam", action="append", metavar="OPTION",
        help="a Beam pipeline option for the runner (repeatable), e.g. "
        "--beam-arg=--direct_num_workers=2 --beam-arg=--direct_running_mode=multi_processing "
        "(default: one worker)",
    ),
)

# --- Kafka and /metrics (serve, stream, exporter) ---------------------------------------------

BOOTSTRAP = Flag(
    "--kafka-bootstrap", "bootstrap", group="kafka", required=True, metavar="HOST:PORT",
    help="Kafka bootstrap servers, comma-separated",
)
TOPIC = Flag(
    "--topic", "topic", group="kafka", required=True, help="the chatbot's inference-log topic"
)
KAFKA_TIMEOUT = duration_flag(
    "--kafka-timeout", "kafka_timeout_seconds", group="kafka",
    help="timeout of one Kafka request (default: {default})",
)
METRICS_SERVER = (
    Flag(
        "--metrics-host", "metrics_host", group="service",
        help="address of the metrics and health listeners (default: %(default)s, this host "
        "only; in a container pass 0.0.0.0 or the pod address so Prometheus and the kubelet "
        "can reach them)",
    ),
    Flag(
        "--metrics-port", "metrics_port", group="service", type=int,
        help="port of /metrics (and of /healthz, for probes written before --health-port) "
        "(default: %(default)s)",
    ),
    Flag(
        "--health-port", "health_port", group="service", type=int,
        help="port of the health listener: /healthz alone, plain HTTP without auth, for "
        "liveness and readiness probes; no crowd of clients on --metrics-port can keep its "
        "probes from being answered (default: %(default)s; must differ from --metrics-port)",
    ),
    Flag(
        "--web-config-file", "web_config_file", group="service", type=Path, metavar="FILE",
        help="TLS and basic auth for /metrics, in the Prometheus exporters' web config format "
        "(tls_server_config, basic_auth_users with bcrypt hashes); /healthz stays open, and "
        "the --health-port listener is always plain HTTP without auth",
    ),
)

# --- the commands -----------------------------------------------------------------------------

RUN = FlagTable(RunSettings, (
    Flag(
        "input", "input", type=Path,
        help="JSON Lines file, one inference-log event per line (see --input-format)",
    ),
    Flag(
        "--output", "output", type=Path,
        help=f"directory for {VERDICTS_FILE}, {WINDOWS_FILE}, {DEAD_LETTER_FILE} and "
        f"{METRICS_FILE} (default: out/)",
    ),
    *BATCH,
    *SESSIONS,
    LABELS,
    JUDGES,
    *BEAM,
))

_WATERMARK = "watermark and cycles"
# How the watermark follows the topic's record times, in serve and in stream (WatermarkFields).
WATERMARK = (
    duration_flag(
        "--out-of-orderness", "out_of_orderness_seconds", group=_WATERMARK, positive=False,
        help="how far event times may run behind within a partition; the watermark "
        "trails the latest event time by this much (default: {default})",
    ),
    duration_flag(
        "--partition-idle-after", "partition_idle_after_seconds", group=_WATERMARK,
        positive=False,
        help="a partition that has had nothing new to read for this long is idle and stops "
        "holding the watermark back (like Flink's withIdleness); until then a quiet "
        "partition keeps it, so that its next events are not late (default: {default})",
    ),
)
SERVE = FlagTable(ServeSettings, (
    BOOTSTRAP,
    TOPIC,
    Flag(
        "--dead-letter-topic", "dead_letter_topic", group="kafka",
        help="where invalid and late records go, with reason, source partition and "
        "offset headers (default: TOPIC.dlq)",
    ),
    Flag(
        "--verdicts-topic", "verdicts_topic", group="kafka",
        help="where verdict rows (the verdicts.jsonl format of `ragpulse run`, keyed by "
        "request_id) are published, to read the rationale of a failing answer "
        "(default: TOPIC.verdicts)",
    ),
    Flag(
        "--publish-verdicts", "publish_verdicts", group="kafka",
        choices=["failing", "all", "none"],
        help="which verdict rows to publish: failing (any judge said no or error), all, or "
        "none (default: %(default)s)",
    ),
    Flag(
        "--evaluation-events-endpoint", "evaluation_events_endpoint", group="kafka",
        metavar="URL",
        help="send each verdict on an answer from a trace as an OpenTelemetry "
        "gen_ai.evaluation.result event, linked to its trace and span, to this OTLP/HTTP logs "
        "URL (e.g. http://collector:4318/v1/logs); rationales as --store-text allows "
        "(default: not sent)",
    ),
    Flag(
        "--group-id", "group_id", group="kafka",
        help="consumer group the processed offsets are committed to, for lag tools "
        "(default: %(default)s); the group is never joined",
    ),
    Flag(
        "--max-batch-events", "max_batch_events", group="kafka", type=int,
        help="most records one cycle reads (default: %(default)s)",
    ),
    KAFKA_TIMEOUT,
    Flag(
        "--on-offset-reset", "on_offset_reset", group="kafka",
        choices=["earliest", "latest", "fail"],
        help="what to do when a saved offset is outside its partition (topic recreated, "
        "truncated or emptied; retention ahead of serve): earliest goes on from the log start "
        "(skips nothing still readable), latest from the log end, fail stops serve (exit code "
        f"{EXIT_OFFSET_RESET}); always logged and counted (default: %(default)s)",
    ),
    duration_flag(
        "--undeliverable-after", "undeliverable_after_seconds", group="kafka",
        help="how long dead letters and verdict rows the broker does not acknowledge are "
        "retried (the cycle fails and runs again) before they are counted as undeliverable "
        "and the cycle moves on (default: {default}); records the broker refuses for good "
        "(too large, invalid) are counted at once",
    ),
    kafka_security("kafka security"),
    *BATCH,
    duration_flag(
        "--allowed-lateness", "allowed_lateness_seconds", group=_WATERMARK, positive=False,
        help="how long after its end a window still takes late events (default: {default})",
    ),
    *WATERMARK,
    duration_flag(
        "--trigger-interval", "trigger_interval_seconds", group=_WATERMARK,
        help="time between cycles when caught up (default: {default})",
    ),
    duration_flag(
        "--trace-assembly-wait", "trace_assembly_wait_seconds", group=_WATERMARK,
        positive=False,
        help="with --input-format otlp_json|otlp_proto: how long the spans of a trace are "
        "gathered, from the first one read, before the trace is judged or dead-lettered "
        "(default: {default})",
    ),
    Flag(
        "--state", "state", group="service", type=Path,
        help="SQLite file holding windows, offsets and counters (default: %(default)s); "
        "only a missing file starts fresh",
    ),
    Flag(
        "--state-reset", "state_reset", group="service", action="store_true",
        help="if the state file cannot be used (empty, damaged, newer schema, written under "
        "another --instance/--instances, ...), rename it to FILE.corrupt-<time> and start "
        "fresh, going on from the consumer group's committed offsets (else the log start); "
        "windows and counters restart from zero",
    ),
    Flag(
        "--instances", "instances", group="service", type=int, metavar="N",
        help="how many serve instances split the topic's partitions (default: %(default)s); "
        "every instance of the deployment gets the same N, its own --instance, state file and "
        "/metrics port",
    ),
    Flag(
        "--instance", "instance", group="service", type=int, metavar="I",
        help="which of the --instances this one is, 0 to N-1: it reads, counts and commits "
        "the partitions p with p %% N == I, including partitions added later "
        "(default: %(default)s)",
    ),
    *METRICS_SERVER,
    duration_flag(
        "--unhealthy-after", "unhealthy_after_seconds", group="service",
        help="/healthz answers 503 once cycles have failed, or one cycle has run, for this "
        "long (default: {default}); set it above your longest cycle",
    ),
    duration_flag(
        "--retention", "retention_seconds", group="service",
        help="how long complete windows stay in the state file for `ragpulse windows`, in "
        "event time (default: {default}); counters are never pruned",
    ),
    Flag(
        "--canary-file", "canary_file", group="judge canaries", type=Path, metavar="FILE",
        help="golden set: JSON Lines of events with human labels, e.g. "
        '{..., "labels": {"groundedness": "no"}}; they are judged with the traffic and '
        "counted only in ragpulse_canary_verdicts_total (default: no canaries)",
    ),
    Flag(
        "--canary-rate", "canary_rate_per_minute", group="judge canaries", type=float,
        metavar="N", help="golden events judged per minute, in turn (default: %(default)s)",
    ),
    LABELS,
    JUDGES,
    BUDGET,
    *SESSIONS,
    Flag(
        "--session-max-open", "session_max_open", group=_SESSIONS, type=int, metavar="N",
        help="most conversations kept open in the state file; beyond it the ones with the "
        "oldest last turn are judged early and counted in ragpulse_sessions_closed_early_total "
        "(default: %(default)s)",
    ),
    *REVIEW,
    Flag(
        "--labels-topic", "labels_topic", group=_REVIEW,
        help="the reviewers' labels `ragpulse review` publishes, read back into each judge's "
        "agreement with people and its corrected pass ratio, exactly once (read whatever "
        "--review-rate is; instance 0 of --instances only) (default: TOPIC.labels)",
    ),
    *BEAM,
))


def _key_value(text: str) -> str:
    """argparse type for KEY=VALUE (kept as text, so that --print-config shows it as given)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _pairs(texts: list[str]) -> tuple[tuple[str, str], ...]:
    return tuple((key.strip(), value) for key, _, value in (t.partition("=") for t in texts))


STREAM = FlagTable(StreamSettings, (
    dataclasses.replace(
        BOOTSTRAP,
        help="Kafka bootstrap servers, comma-separated (as the runner's workers reach them)",
    ),
    TOPIC,
    Flag(
        "--dead-letter-topic", "dead_letter_topic", group="kafka",
        help="where invalid records go, with reason, source partition and offset headers "
        "(default: TOPIC.dlq)",
    ),
    Flag(
        "--ratings-topic", "ratings_topic", group="kafka",
        help="where each window pane is published for `ragpulse exporter`, keyed by window "
        "(default: TOPIC.ratings; make it a compacted topic)",
    ),
    duration_flag(
        "--kafka-timeout", "kafka_timeout_seconds", group="kafka",
        help="timeout of one publish to the dead-letter and ratings topics "
        "(default: {default})",
    ),
    Flag(
        "--kafka-consumer-config", "consumer_config", group="kafka", type=_key_value,
        action="append", metavar="KEY=VALUE", read=_pairs,
        help="a Java Kafka consumer property of the reader (repeatable), e.g. "
        "security.protocol=SASL_SSL, group.id=ragpulse; the reader is Beam's Java KafkaIO, "
        "which does not use the --kafka-* security flags (those are for the publishers)",
    ),
    Flag(
        "--expansion-service", "expansion_service", group="kafka", metavar="HOST:PORT",
        help="a running Beam expansion service with ragpulse's Kafka read (java/kafka-read) "
        "on its classpath, which expands the Java Kafka reader (needed; e.g. "
        + START_EXPANSION_SERVICE + ")",
    ),
    kafka_security("kafka security (publishers)"),
    *EVENTS,
    duration_flag(
        "--allowed-lateness", "allowed_lateness_seconds", group="panes", positive=False,
        help="how long after the watermark passed its end a window still takes late events, "
        "each in a late pane (default: {default}); later ones are dropped by the runner and "
        "counted in its metrics",
    ),
    *WATERMARK,
    duration_flag(
        "--early-firing", "early_firing_seconds", group="panes",
        help="processing time between early panes of an open window, whole seconds "
        "(default: {default})",
    ),
    *SESSIONS,
    *REVIEW,
    Flag(
        "--labels-topic", "labels_topic", group=_REVIEW,
        help="the reviewers' labels `ragpulse review` publishes, read back (with --review-rate "
        "above 0) into each judge's agreement with people, counted once per label in Beam "
        "state and published as label counts to the ratings topic (default: TOPIC.labels)",
    ),
    duration_flag(
        "--review-label-horizon", "review_label_horizon_seconds", group=_REVIEW,
        help="how long after an event its queued verdicts are remembered for their labels; a "
        "label of an item queued longer ago (or never) is dead-lettered as unknown_event "
        "(default: {default})",
    ),
    JUDGES,
    Flag(
        "--runner", "runner", group="beam", required=True, metavar="NAME",
        help=f"the Beam runner: {', '.join(STREAM_RUNNERS)}; its options with --beam-arg",
    ),
    Flag(
        "--beam-arg", "beam_args", group="beam", action="append", metavar="OPTION",
        help="a Beam pipeline option for the runner (repeatable), e.g. "
        "--beam-arg=--project=P --beam-arg=--region=R (Dataflow) or "
        "--beam-arg=--job_endpoint=HOST:8099 (Flink job server); --streaming is always set",
    ),
    Flag(
        "--wait", "wait", group="beam", action="store_true",
        help="wait for the job to end instead of returning once it is submitted (needed with "
        "--beam-arg=--environment_type=LOOPBACK, whose workers live in this process)",
    ),
))

EXPORTER = FlagTable(ExporterSettings, (
    BOOTSTRAP,
    Flag(
        "--ratings-topic", "ratings_topic", group="kafka", required=True,
        help="the topic `ragpulse stream` publishes window panes to",
    ),
    KAFKA_TIMEOUT,
    kafka_security("kafka security"),
    *METRICS_SERVER,
    duration_flag(
        "--unhealthy-after", "unhealthy_after_seconds", group="service",
        help="/healthz answers 503 once the broker has not answered for this long "
        "(default: {default})",
    ),
    duration_flag(
        "--retention", "retention_seconds", group="service",
        help="windows ending this long before the newest one are folded into the counters and "
        "take no more panes; keep it above the stream's --allowed-lateness "
        "(default: {default})",
    ),
    FUTURE_SKEW.in_group("service"),
    LABELS,
    JUDGE_CALIBRATION,
))

REVIEW_PAGE = FlagTable(ReviewSettings, (
    BOOTSTRAP,
    Flag(
        "--topic", "topic", group="kafka",
        help="the chatbot's inference-log topic of serve or stream: the review topic is "
        "TOPIC.review and the labels topic TOPIC.labels",
    ),
    Flag(
        "--review-topic", "review_topic", group="kafka",
        help="the review topic serve or stream publish items to (default: TOPIC.review)",
    ),
    Flag(
        "--labels-topic", "labels_topic", group="kafka",
        help="where labels are published, keyed by event id and judge (default: TOPIC.labels)",
    ),
    KAFKA_TIMEOUT,
    kafka_security("kafka security"),
    Flag(
        "--host", "host", group="page",
        help="address of the review page (default: %(default)s, this host only)",
    ),
    Flag("--port", "port", group="page", type=int, help="port (default: %(default)s)"),
    Flag(
        "--web-config-file", "web_config_file", group="page", type=Path, metavar="FILE",
        help="TLS and basic auth, in the Prometheus exporters' web config format (as "
        "--web-config-file of serve): basic_auth_users are the reviewers, and a reviewer's "
        "login is the name on their labels",
    ),
    Flag(
        "--bearer-token-file", "bearer_token_file", group="page", type=Path, metavar="FILE",
        help="reviewers' bearer tokens (Authorization: Bearer, e.g. from a sign-on proxy), "
        "besides or instead of basic auth: one 'REVIEWER SHA256_OF_TOKEN' per line; re-read "
        "when it changes",
    ),
))

CALIBRATE = FlagTable(CalibrateSettings, (
    Flag(
        "input", "input", type=Path, metavar="LABELLED",
        help='JSON Lines of events with their human label, e.g. {..., "label": "no"}: "yes" '
        'or "no", an integer score on a graded scale, or null (left out)',
    ),
    Flag(
        "--output", "output", type=Path, metavar="FILE",
        help="where to write the report as JSON, the file --judge-calibration reads "
        "(default: calibration-JUDGE.json)",
    ),
    Flag(
        "--pass-threshold", "pass_threshold", type=int, metavar="N",
        help="on a graded scale, the lowest score that passes: sensitivity and specificity "
        "(and so --judge-calibration) need it (default: none; yes passes on a binary judge)",
    ),
    Flag(
        "--show", "show", type=int, metavar="N",
        help="disagreements printed (all of them are in --output) (default: %(default)s)",
    ),
    ONE_JUDGE,
))


_LABELS_FROM = "labels (one of)"
ALIGN = FlagTable(AlignSettings, (
    Flag(
        "--kafka-bootstrap", "bootstrap", group=_LABELS_FROM, one_of="labels", required=True,
        metavar="HOST:PORT",
        help="read the labels and the review items from the topics of `ragpulse review`",
    ),
    Flag(
        "--labels", "labels_file", group=_LABELS_FROM, one_of="labels", required=True,
        type=Path, metavar="FILE",
        help="or from a JSON Lines file of label records (the labels topic's format, "
        "docs/review.md), with --items",
    ),
    Flag(
        "--items", "items_file", group=_LABELS_FROM, type=Path, metavar="FILE",
        help="with --labels: JSON Lines of the review items labelled (the review topic's "
        "format)",
    ),
    Flag(
        "--topic", "topic", group="kafka",
        help="the inference-log topic: the review and labels topics are TOPIC.review and "
        "TOPIC.labels",
    ),
    Flag("--review-topic", "review_topic", group="kafka",
         help="the review topic (default: TOPIC.review)"),
    Flag("--labels-topic", "labels_topic", group="kafka",
         help="the labels topic (default: TOPIC.labels)"),
    KAFKA_TIMEOUT,
    kafka_security("kafka security"),
    Flag(
        "--output", "output", type=Path, metavar="DIR",
        help="where the new prompt version and align-report.json are written (default: "
        "aligned-JUDGE); the running prompt is never changed",
    ),
    Flag(
        "--examples", "examples", type=int, metavar="N",
        help="labelled examples added to the prompt: both ratings, the judge's mistakes first, "
        "as different from each other as the labels allow (default: %(default)s)",
    ),
    Flag(
        "--folds", "folds", type=int, metavar="K",
        help="cross-validation folds for the before/after agreement (default: %(default)s)",
    ),
    ONE_JUDGE,
))


IMPORT_LABELS = FlagTable(ImportLabelsSettings, (
    Flag(
        "input", "input", type=Path, metavar="FILE",
        help="the labels: MLflow 3 traces exported as JSON (a trace, a list, or one per line; "
        "their assessments whose source is HUMAN), or CSV / JSON Lines with event_id, judge, "
        "label (yes/no) and optionally reviewer, note, labelled_at, judge_rating, "
        "prompt_version",
    ),
    Flag(
        "--format", "format", required=True, choices=["mlflow", "csv", "jsonl"],
        help="the file's format",
    ),
    Flag(
        "--reviewer", "reviewer", metavar="NAME",
        help="csv and jsonl: the reviewer of rows that name none (default: each row must)",
    ),
    BOOTSTRAP,
    Flag(
        "--topic", "topic", group="kafka",
        help="the inference-log topic: the review and labels topics are TOPIC.review and "
        "TOPIC.labels",
    ),
    Flag("--review-topic", "review_topic", group="kafka",
         help="where the judges' verdicts on the events are looked up (default: TOPIC.review)"),
    Flag("--labels-topic", "labels_topic", group="kafka",
         help="where the labels go (default: TOPIC.labels)"),
    Flag(
        "--dead-letter-topic", "dead_letter_topic", group="kafka",
        help="rows that cannot be labels, with their reason in the `reason` header (default: "
        "LABELS_TOPIC.dlq)",
    ),
    KAFKA_TIMEOUT,
    kafka_security("kafka security"),
))


# --- the commands around the service: windows, explain, simulate, and `ragpulse` itself --------

LOG_LEVEL: FlagTable[Any] = FlagTable(None, (
    Flag(
        "--log-level", "log_level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log verbosity (default: %(default)s)",
    ),
))

WINDOWS = FlagTable(WindowsSettings, (
    Flag("--state", "state", type=Path, required=True, help="the state file of `ragpulse serve`"),
    Flag("--judge", "judge", help="only this judge"),
    Flag(
        "--since", "since", metavar="TIME",
        help="only windows starting at or after TIME (ISO 8601, or epoch seconds)",
    ),
))

_SOURCE = "source (one of)"
_WINDOW = "window (event time; default: everything)"
EXPLAIN = FlagTable(ExplainSettings, (
    Flag(
        "--run-output", "run_output", group=_SOURCE, type=Path, metavar="DIR",
        help=f"output directory of `ragpulse run` (reads its {VERDICTS_FILE})",
    ),
    Flag(
        "--kafka-bootstrap", "kafka_bootstrap", group=_SOURCE, metavar="HOST:PORT",
        help="Kafka of `ragpulse serve`",
    ),
    Flag(
        "--topic", "topic", group=_SOURCE,
        help="serve's inference-log topic; rows are read from TOPIC.verdicts",
    ),
    Flag(
        "--verdicts-topic", "verdicts_topic", group=_SOURCE, metavar="TOPIC",
        help="the verdicts topic, when serve was given one",
    ),
    duration_flag(
        "--kafka-timeout", "kafka_timeout_seconds", group=_SOURCE,
        help="how long to wait for the broker (default: {default})",
    ),
    Flag(
        "--window-start", "window_start", group=_WINDOW, metavar="TIME",
        help="start, ISO 8601 or epoch seconds",
    ),
    duration_flag(
        "--window", "window_seconds", group=_WINDOW,
        help="length from --window-start; alone, the last DURATION up to now",
    ),
    Flag(
        "--since", "since", group=_WINDOW, metavar="TIME",
        help="from TIME (ISO 8601 or epoch seconds)",
    ),
    Flag("--until", "until", group=_WINDOW, metavar="TIME", help="up to TIME, excluded"),
    Flag("--judge", "judge", group="filters", help="only this judge's verdicts"),
    Flag("--app", "app", group="filters", help="only this app"),
    Flag("--model", "model", group="filters", help="only this model"),
    Flag(
        "--rating", "rating", group="filters", choices=["no", "error"],
        help="only this rating (default: both)",
    ),
    Flag(
        "--limit", "limit", type=int, metavar="N",
        help="show the N most recent (default: %(default)s; 0 shows all)",
    ),
    Flag("--json", "as_json", action="store_true", help="JSON lines instead of a table"),
))


def _simulate_security(values: dict[str, Any], fields: dict[str, Any]) -> KafkaSecurity:
    """The --kafka-* security of the producer; with --output nothing connects, so none."""
    return PLAINTEXT if fields["output"] is not None else security_from(values)


def _names(text: str) -> tuple[str, ...]:
    names = comma_list(text)
    if not names:
        raise ValueError(f"expected a comma-separated list of names, got {text!r}")
    return names


def _offset(name: str, field: str, help: str) -> Flag:
    """A time T of simulate's traffic: an offset from its start, e.g. 90s or 5m."""
    return Flag(name, field, type=duration, metavar="T", help=help)


SIMULATE = FlagTable(SimulateSettings, (
    Flag(
        "--kafka-bootstrap", "kafka_bootstrap", one_of="target", required=True,
        metavar="HOST:PORT", help="produce to this broker",
    ),
    Flag(
        "--output", "output", one_of="target", required=True, type=Path, metavar="FILE",
        help="write JSON lines instead",
    ),
    Flag("--topic", "topic", help="Kafka topic (default %(default)s)"),
    Flag(
        "--partitions", "partitions", type=int,
        help="create the topic with this many partitions if it does not exist",
    ),
    Flag(
        "--rate", "rate", type=float, metavar="EVENTS_PER_S",
        help="events per second (default %(default)s)",
    ),
    Flag(
        "--duration", "duration_seconds", type=duration, metavar="D",
        help="how long to produce (event time span with --output), e.g. 30s, 5m (default 60s)",
    ),
    Flag(
        "--seed", "seed", type=int,
        help="random seed: the same seed gives the same events (default %(default)s)",
    ),
    dataclasses.replace(kafka_security("kafka security"), build=_simulate_security),
    Flag(
        "--start-time", "start_time", metavar="ISO8601",
        help="first event time (default now; set it for reproducible files)",
    ),
    Flag("--apps", "apps", text=joined, read=_names, help="comma-separated app names"),
    Flag("--models", "models", text=joined, read=_names, help="comma-separated models"),
    _offset(
        "--groundedness-drop-at", "groundedness_drop_at",
        "from T on, only --drop-to of the answers are grounded; the others invent numbers and "
        "names",
    ),
    _offset(
        "--groundedness-recover-at", "groundedness_recover_at",
        "from T on, answers are grounded again",
    ),
    Flag(
        "--drop-to", "drop_to", type=float,
        help="share of grounded answers during the drop (default %(default)s)",
    ),
    _offset(
        "--unsafe-burst-at", "unsafe_burst_at", "at T, send a burst of clearly harmful answers"
    ),
    Flag(
        "--unsafe-burst-count", "unsafe_burst_count", type=int, metavar="N",
        help="answers in the unsafe burst (default %(default)s)",
    ),
    _offset(
        "--malformed-burst-at", "malformed_burst_at",
        "at T, send a burst of malformed records (bad JSON, wrong types, missing fields, "
        "non-UTF-8)",
    ),
    Flag(
        "--malformed-burst-count", "malformed_burst_count", type=int, metavar="N",
        help="records in the malformed burst (default %(default)s)",
    ),
    Flag(
        "--late-events", "late_events", type=int, metavar="N",
        help="send N events whose timestamps are --late-by in the past",
    ),
    Flag(
        "--late-by", "late_by_seconds", type=duration, metavar="D",
        help="how late the late events are (default {default})",
    ),
    Flag(
        "--no-context-share", "no_context_share", type=float, metavar="S",
        help="share of events retrieved without any chunk (0..1)",
    ),
    Flag(
        "--tool-call-share", "tool_call_share", type=float, metavar="S",
        help="share of answers whose agent called 1-3 tools (0..1, default %(default)s)",
    ),
    _offset(
        "--tool-failure-at", "tool_failure_at",
        "from T on, every call of --failing-tool fails (and is often repeated)",
    ),
    _offset(
        "--tool-recover-at", "tool_recover_at", "from T on, the failing tool works again"
    ),
    Flag(
        "--failing-tool", "failing_tool", choices=tuple(SIMULATED_TOOLS),
        help="the tool that fails from --tool-failure-at (default %(default)s)",
    ),
    Flag(
        "--conversation-turns", "conversation_turns", type=int, metavar="N",
        help="send conversations of N turns sharing a session_id (default: 0, no conversations)",
    ),
    _offset(
        "--forgetting-at", "forgetting_at",
        "from T on, the model forgets earlier turns of a conversation: later turns' answers "
        "ask again, and the user complains (needs --conversation-turns 2 or more)",
    ),
))
