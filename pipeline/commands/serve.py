"""`ragpulse serve`: watch a live Kafka topic in micro-batches, exactly once, with /metrics.

This module is the command: its flags, its settings, and start-up (settings and files checked,
the state file opened, Kafka access checked, /metrics started, signals handled). The loop
itself is `pipeline.service.loop.TopicWatcher`.
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import make_wsgi_app

from ragpulse.pipeline.canaries import CanaryFeed, GoldenSetError, load_golden_set
from ragpulse.pipeline.costs.budget import add_budget_arguments, budget_settings
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.kafka_security import (
    add_kafka_security_arguments,
    check_access,
    security_from_args,
)
from ragpulse.pipeline.metrics.collector import registry_for
from ragpulse.pipeline.metrics.http import (
    MetricsHTTPServer,
    WebConfig,
    exporter_app,
    load_web_config,
    start_metrics_server,
)
from ragpulse.pipeline.metrics.labels import add_label_arguments
from ragpulse.pipeline.service.owners import Owner
from ragpulse.pipeline.service.state import StateError, StateLock
from ragpulse.pipeline.settings.models import (
    ServeSettings,
    add_batch_arguments,
    add_beam_arguments,
    add_duration_flag,
    add_judge_arguments,
    add_metrics_server_arguments,
    add_session_arguments,
    add_setting_flag,
    batch_fields,
    build,
    metrics_server_fields,
    session_fields,
)
from ragpulse.pipeline.settings.sources import add_config_arguments

if TYPE_CHECKING:
    from ragpulse.pipeline.service.loop import TopicWatcher

log = logging.getLogger(__name__)

EXIT_OFFSET_RESET = 3


def canary_feed(settings: ServeSettings) -> CanaryFeed | None:
    """The golden-set feed of --canary-file (None without one); SettingsError names the file
    and line of a bad canary."""
    if settings.canary_file is None:
        return None
    try:
        golden = load_golden_set(settings.canary_file, settings.judges.names)
    except GoldenSetError as exc:
        raise SettingsError(str(exc)) from None
    log.info(
        "canaries: %d golden events from %s, %g per minute",
        len(golden),
        settings.canary_file,
        settings.canary_rate_per_minute,
    )
    return CanaryFeed(golden, settings.canary_rate_per_minute, time.time())


def serve_http(
    watcher: TopicWatcher, host: str, port: int, web: WebConfig | None = None
) -> MetricsHTTPServer:
    """Start /metrics and /healthz in a daemon thread; returns the server (for its port)."""
    registry = registry_for(watcher.snapshot)
    web = web or WebConfig()
    app = exporter_app(make_wsgi_app(registry), watcher.healthy, web.users)
    return start_metrics_server(app, host, port, web.tls)


def configure_parser(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("kafka")
    k.add_argument(
        "--kafka-bootstrap",
        required=True,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers, comma-separated",
    )
    k.add_argument("--topic", required=True, help="the chatbot's inference-log topic")
    k.add_argument(
        "--dead-letter-topic",
        default=None,
        help="where invalid and late records go, with reason, source partition and "
        "offset headers (default: TOPIC.dlq)",
    )
    k.add_argument(
        "--verdicts-topic",
        default=None,
        help="where verdict rows (the verdicts.jsonl format of `ragpulse run`, keyed by "
        "request_id) are published, to read the rationale of a failing answer "
        "(default: TOPIC.verdicts)",
    )
    add_setting_flag(
        k, "--publish-verdicts", ServeSettings, "publish_verdicts",
        help="which verdict rows to publish: failing (any judge said no or error), all, or "
        "none (default: %(default)s)",
        choices=["failing", "all", "none"],
    )
    add_setting_flag(
        k, "--evaluation-events-endpoint", ServeSettings, "evaluation_events_endpoint",
        help="send each verdict on an answer from a trace as an OpenTelemetry "
        "gen_ai.evaluation.result event, linked to its trace and span, to this OTLP/HTTP logs "
        "URL (e.g. http://collector:4318/v1/logs); rationales as --store-text allows "
        "(default: not sent)",
        metavar="URL",
    )
    add_setting_flag(
        k, "--group-id", ServeSettings, "group_id",
        help="consumer group the processed offsets are committed to, for lag tools "
        "(default: %(default)s); the group is never joined",
    )
    add_setting_flag(
        k, "--max-batch-events", ServeSettings, "max_batch_events", type=int,
        help="most records one cycle reads (default: %(default)s)",
    )
    add_duration_flag(
        k, "--kafka-timeout", ServeSettings, "kafka_timeout_seconds",
        "timeout of one Kafka request (default: {default})",
    )
    add_setting_flag(
        k, "--on-offset-reset", ServeSettings, "on_offset_reset",
        help="what to do when a saved offset is outside its partition (topic recreated, "
        "truncated or emptied; retention ahead of serve): earliest goes on from the log start "
        "(skips nothing still readable), latest from the log end, fail stops serve (exit code "
        f"{EXIT_OFFSET_RESET}); always logged and counted (default: %(default)s)",
        choices=["earliest", "latest", "fail"],
    )
    add_duration_flag(
        k, "--undeliverable-after", ServeSettings, "undeliverable_after_seconds",
        "how long dead letters and verdict rows the broker does not acknowledge are "
        "retried (the cycle fails and runs again) before they are counted as undeliverable "
        "and the cycle moves on (default: {default}); records the broker refuses for good "
        "(too large, invalid) are counted at once",
    )
    add_kafka_security_arguments(p.add_argument_group("kafka security"))
    add_batch_arguments(p)
    w = p.add_argument_group("watermark and cycles")
    add_duration_flag(
        w, "--allowed-lateness", ServeSettings, "allowed_lateness_seconds",
        "how long after its end a window still takes late events "
        "(default: {default})",
        positive=False,
    )
    add_duration_flag(
        w, "--out-of-orderness", ServeSettings, "out_of_orderness_seconds",
        "how far event times may run behind within a partition; the watermark "
        "trails the latest event time by this much "
        "(default: {default})",
        positive=False,
    )
    add_duration_flag(
        w, "--partition-idle-after", ServeSettings, "partition_idle_after_seconds",
        "a partition that has had nothing new to read for this long is idle and stops "
        "holding the watermark back (like Flink's withIdleness); until then a quiet "
        "partition keeps it, so that its next events are not late "
        "(default: {default})",
        positive=False,
    )
    add_duration_flag(
        w, "--trigger-interval", ServeSettings, "trigger_interval_seconds",
        "time between cycles when caught up (default: {default})",
    )
    add_duration_flag(
        w, "--trace-assembly-wait", ServeSettings, "trace_assembly_wait_seconds",
        "with --input-format otlp_json|otlp_proto: how long the spans of a trace are "
        "gathered, from the first one read, before the trace is judged or dead-lettered "
        "(default: {default})",
        positive=False,
    )
    s = p.add_argument_group("service")
    add_setting_flag(
        s, "--state", ServeSettings, "state", type=Path,
        help="SQLite file holding windows, offsets and counters (default: %(default)s); "
        "only a missing file starts fresh",
    )
    s.add_argument(
        "--state-reset",
        action="store_true",
        help="if the state file cannot be used (empty, damaged, newer schema, written under "
        "another --instance/--instances, ...), rename it "
        "to FILE.corrupt-<time> and start fresh, going on from the consumer group's committed "
        "offsets (else the log start); windows and counters restart from zero",
    )
    add_setting_flag(
        s, "--instances", ServeSettings, "instances", type=int, metavar="N",
        help="how many serve instances split the topic's partitions (default: %(default)s); "
        "every instance of the deployment gets the same N, its own --instance, state file and "
        "/metrics port",
    )
    add_setting_flag(
        s, "--instance", ServeSettings, "instance", type=int, metavar="I",
        help="which of the --instances this one is, 0 to N-1: it reads, counts and commits "
        "the partitions p with p %% N == I, including partitions added later "
        "(default: %(default)s)",
    )
    add_metrics_server_arguments(s, ServeSettings)
    add_duration_flag(
        s, "--unhealthy-after", ServeSettings, "unhealthy_after_seconds",
        "/healthz answers 503 once cycles have failed, or one cycle has run, for this long "
        "(default: {default}); set it above your longest cycle",
    )
    add_duration_flag(
        s, "--retention", ServeSettings, "retention_seconds",
        "how long complete windows stay in the state file for `ragpulse windows`, in event "
        "time (default: {default}); counters are never pruned",
    )
    c = p.add_argument_group("judge canaries")
    c.add_argument(
        "--canary-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="golden set: JSON Lines of events with human labels, e.g. "
        '{..., "labels": {"groundedness": "no"}}; they are judged with the traffic and '
        "counted only in ragpulse_canary_verdicts_total (default: no canaries)",
    )
    add_setting_flag(
        c, "--canary-rate", ServeSettings, "canary_rate_per_minute", type=float, metavar="N",
        help="golden events judged per minute, in turn (default: %(default)s)",
    )
    add_label_arguments(p)
    add_judge_arguments(p)
    add_budget_arguments(p)
    add_session_arguments(p)
    add_beam_arguments(p)
    add_config_arguments(p)


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """`ServeSettings` from the command line; SettingsError says what is wrong."""
    batch = batch_fields(args)
    return build(
        ServeSettings,
        bootstrap=args.kafka_bootstrap,
        topic=args.topic,
        dead_letter_topic=args.dead_letter_topic or f"{args.topic}.dlq",
        verdicts_topic=args.verdicts_topic or f"{args.topic}.verdicts",
        publish_verdicts=args.publish_verdicts,
        group_id=args.group_id,
        state=args.state,
        allowed_lateness_seconds=args.allowed_lateness,
        out_of_orderness_seconds=args.out_of_orderness,
        partition_idle_after_seconds=args.partition_idle_after,
        trigger_interval_seconds=args.trigger_interval,
        max_batch_events=args.max_batch_events,
        **metrics_server_fields(args),
        unhealthy_after_seconds=args.unhealthy_after,
        retention_seconds=args.retention,
        kafka_timeout_seconds=args.kafka_timeout,
        kafka_security=security_from_args(args),
        canary_file=args.canary_file,
        canary_rate_per_minute=args.canary_rate,
        on_offset_reset=args.on_offset_reset,
        undeliverable_after_seconds=args.undeliverable_after,
        state_reset=args.state_reset,
        instances=args.instances,
        instance=args.instance,
        budget=budget_settings(args, batch["judges"].model, batch["judges"].backend),
        trace_assembly_wait_seconds=args.trace_assembly_wait,
        evaluation_events_endpoint=args.evaluation_events_endpoint,
        **batch,
        **session_fields(args),
    )


def main(args: argparse.Namespace) -> int:
    # Settings and files first, all of them checked before anything is opened; then the state
    # file, whose one-line error (when it cannot be used) says how to recover.
    settings = settings_from_args(args)
    # The loop (and with it Beam, seconds to import) once the settings are checked: a refused
    # flag or setting answers at once.
    from ragpulse.pipeline.service.loop import (
        OffsetResetRefused,
        StopRequest,
        TopicWatcher,
        open_state,
    )

    web = load_web_config(settings.web_config_file) if settings.web_config_file else WebConfig()
    canaries = canary_feed(settings)
    owner = Owner.this_process(
        settings.instance, settings.instances, settings.unhealthy_after_seconds
    )
    try:
        # Before the file is opened: --state-reset must not move aside a live serve's file.
        lock = StateLock(settings.state, owner.id)
    except StateError as exc:
        raise SettingsError(str(exc)) from None
    state, was_reset = open_state(settings)
    # A refused certificate or password stops serve here, with the setting to fix; retrying
    # would only hammer the broker with connections it will refuse.
    check_access(
        settings.bootstrap, settings.kafka_security, timeout_s=settings.kafka_timeout_seconds
    )
    watcher = TopicWatcher(
        settings, state, was_reset=was_reset, canaries=canaries,
        owner=owner, previous_owner=lock.previous_owner,
    )
    found = watcher.check_owners()
    if found:
        watcher.close()
        raise SettingsError(
            f"another serve reads partitions of {settings.topic!r} in consumer group "
            f"{settings.group_id!r} ({'; '.join(w for w, _ in found)}): give every instance "
            "the same --instances and its own --instance (if that serve has stopped, its "
            f"lease ends --unhealthy-after its last commit)"
        )
    server = serve_http(watcher, settings.metrics_host, settings.metrics_port, web)
    log.info(
        "serving /metrics (%s%s) and /healthz on %s:%d; watching %s on %s (%s) with %s "
        "(backend %s), "
        "sample rate %g, %gs windows, %gs allowed lateness; state %s",
        "https" if web.tls else "http",
        ", basic auth" if web.users else "",
        settings.metrics_host,
        server.server_port,
        settings.topic,
        settings.bootstrap,
        settings.kafka_security.describe(),
        ",".join(settings.judges.names),
        settings.judges.backend,
        settings.sample_rate,
        settings.window_seconds,
        settings.allowed_lateness_seconds,
        settings.state,
    )
    stop = StopRequest()

    def request_stop(signum: int, _frame: Any) -> None:
        # No logging and no locks in a signal handler: the loop logs once it sees the request.
        stop.request(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        watcher.serve_forever(stop)
    except OffsetResetRefused as exc:
        log.error("stopping: %s", exc)
        return EXIT_OFFSET_RESET
    finally:
        watcher.close()
        server.shutdown()
    log.info("stopped; state saved in %s", settings.state)
    return 0
