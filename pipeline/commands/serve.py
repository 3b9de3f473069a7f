"""`ragpulse serve`: watch a live Kafka topic in micro-batches, exactly once, with /metrics.

This module is the command: its flags, its settings, and start-up (settings and files checked,
the state file opened, Kafka access checked, the metrics and health listeners started, signals
handled). The loop itself is `pipeline.service.loop.TopicWatcher`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import make_wsgi_app

from ragpulse.pipeline.canaries import CanaryFeed, GoldenSetError, load_golden_set
from ragpulse.pipeline.errors import EXIT_CYCLE_ABANDONED, EXIT_OFFSET_RESET, SettingsError
from ragpulse.pipeline.kafka_security import check_access
from ragpulse.pipeline.metrics.collector import registry_for
from ragpulse.pipeline.metrics.http import (
    MetricsHTTPServer,
    WebConfig,
    exporter_app,
    load_web_config,
    start_health_server,
    start_metrics_server,
)
from ragpulse.pipeline.service.cycle_hooks import CycleHooks
from ragpulse.pipeline.service.owners import Owner
from ragpulse.pipeline.service.state import StateError, StateLock
from ragpulse.pipeline.settings.models import ServeSettings

if TYPE_CHECKING:
    from ragpulse.pipeline.costs.controls import CostControl
    from ragpulse.pipeline.service.loop import StopRequest, TopicWatcher
    from ragpulse.pipeline.service.state import StateStore

log = logging.getLogger(__name__)

# How long serve lets the cycle in flight finish after SIGTERM before it abandons it: within
# Kubernetes' default terminationGracePeriodSeconds (30 s) with room for the process to exit.
# Abandoning is safe: nothing of a cycle is saved before its one transaction commits, so it
# replays after the restart, as after a SIGKILL (its paid judge calls come back from the call
# journal; its dead letters and verdict rows may be published twice, as after any crash).
STOP_GRACE_SECONDS = 25.0

__all__ = ["EXIT_OFFSET_RESET", "canary_feed", "cost_controls", "main", "serve_http"]


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


def cost_controls(settings: ServeSettings, state: StateStore) -> list[CostControl]:
    """serve's cost controls (`pipeline.costs.controls`), in the order a cycle's spend goes
    through them; the loop names none of them.

    - the journal of answered calls (pipeline/service/journal.py), where calls are paid for (an
      LLM backend) and the judge stage runs in this process, attached to its judge panel; the
      cascade's panels are its bundles' own and are not journaled;
    - the judge budget's governor (pipeline/costs/budget.py), going on from the spend and the
      counters saved in `state`;
    - the lookahead (pipeline/service/lookahead.py), which starts the calls of the next
      cycle's events by the settings' own sampling: only where no other control changes which
      calls a cycle makes, and each record is an event.
    """
    from ragpulse.judges import shared_panel
    from ragpulse.pipeline.costs.budget import BudgetGovernor
    from ragpulse.pipeline.service.journal import AnsweredCalls
    from ragpulse.pipeline.service.lookahead import Lookahead, runs_here
    from ragpulse.pipeline.sources.inputs import input_for

    controls: list[CostControl] = []
    config = settings.stage_config()
    paid_here = settings.judges.backend != "local" and runs_here(settings)
    if paid_here and settings.cascade is None:
        journal = AnsweredCalls(state.path, settings.judges.text_policy())
        shared_panel(config.judges).journal = journal
        controls.append(journal)
    if settings.budget is not None:
        governor = BudgetGovernor(settings.budget)
        saved = state.hour_spend()
        if saved is not None:
            governor.restore(saved.hour, saved.unit, saved.spent, state.counters(), saved)
        controls.append(governor)
    changing = [c.changes_judge_calls for c in controls]
    if settings.cascade is not None:
        changing.append(settings.cascade.changes_judge_calls)
    if paid_here and input_for(settings.input_format).records_are_events and not any(changing):
        controls.append(Lookahead(settings, shared_panel(config.judges), config.judge_batch_size))
    return controls


def serve_http(
    watcher: TopicWatcher, host: str, port: int, web: WebConfig | None = None
) -> MetricsHTTPServer:
    """Start /metrics and /healthz in a daemon thread; returns the server (for its port)."""
    registry = registry_for(watcher.snapshot)
    web = web or WebConfig()
    app = exporter_app(make_wsgi_app(registry), watcher.healthy, web.users)
    return start_metrics_server(app, host, port, web.tls)


def main(settings: ServeSettings) -> int:
    # The settings come checked; then the files they name, all before anything is opened; then
    # the state file, whose one-line error (when it cannot be used) says how to recover.
    # The loop (and with it Beam, seconds to import) is imported when serve starts, not with
    # this module.
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
        controls=cost_controls(settings, state),
    )
    try:
        # Before the first cycle counts anything: a second owner is refused here.
        watcher.partitions.claim(CycleHooks.from_environment())
    except BaseException:
        watcher.close()
        raise
    health = start_health_server(watcher.healthy, settings.metrics_host, settings.health_port)
    try:
        server = serve_http(watcher, settings.metrics_host, settings.metrics_port, web)
    except BaseException:
        health.shutdown()
        raise
    log.info(
        "serving %s, /healthz alone on port %d; watching %s on %s (%s) with %s (backend %s), "
        "sample rate %g, %gs windows, %gs allowed lateness; state %s",
        web.describe(settings.metrics_host, server.server_port),
        health.server_port,
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
    threading.Thread(
        target=_stop_within, args=(stop, STOP_GRACE_SECONDS), name="stop-deadline", daemon=True
    ).start()
    try:
        watcher.serve_forever(stop)
    except OffsetResetRefused as exc:
        log.error("stopping: %s", exc)
        return EXIT_OFFSET_RESET
    finally:
        watcher.close()
        server.shutdown()
        health.shutdown()
    log.info("stopped; state saved in %s", settings.state)
    return 0


def _stop_within(stop: StopRequest, grace: float) -> None:
    """Once a stop is requested, give serve `grace` seconds to finish its cycle and close;
    then end the process, the cycle in flight unsaved (see STOP_GRACE_SECONDS). A thread, not
    the signal handler: the handler may take no lock, and the main thread may be anywhere
    (inside the Beam graph, waiting on a judge or a broker)."""
    while not stop.requested:
        time.sleep(stop.POLL_SECONDS)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        time.sleep(stop.POLL_SECONDS)
    log.error(
        "stop requested (%s) %.0fs ago and serve has not stopped: the cycle in flight is "
        "abandoned, nothing of it saved; it replays after a restart", stop.why, grace,
    )
    os._exit(EXIT_CYCLE_ABANDONED)
