"""The Beam graph of one bounded run: a source, the stages, the sinks, and a typed result.

`ragpulse run` builds it once over a file (sinks: the output files); `ragpulse serve` builds it
once per micro-batch over Kafka offset ranges (sinks: the dead-letter and verdicts topics). As
in Beam's `leader_board` example, reading and writing are steps of the graph:

    source ──> ParseEvents ──> JudgeEvents ──> WindowRatings ──> ReportWindows
                   │                │   ├──> verdict sink        (└──> windows file, run only)
                   │                │   └──> QueueForReview ──> review topic (serve, --review-rate)
                   │                └──> ReportLatestFailing (serve: exemplars)
                   ├──> dead-letter sink
                   └──> GroupSessions ──> JudgeEvents (session judges) ──> joins the answers
                        (--session-judges: pipeline.stages.sessions)

What the caller needs back to save or print (counter increments, window counts, each
partition's latest event time, exemplars, records an output topic did not acknowledge) are
small aggregates: they leave the workers as Beam metrics, which every runner gathers for the
program that ran the pipeline, and `run_graph` decodes them into a `GraphResult`. Nothing is
written to a file to be read back.

The runner is a parameter: `--runner` (checked by `settings.runner_name`) and Beam pipeline
options (`--job_endpoint`, `--direct_num_workers`, ...) are passed through; without `--runner`
the graph runs on Beam's FnApiRunner in this process (see README, "Why micro-batches").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import shutil
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
import grpc
import orjson
from apache_beam.metrics.metric import MetricResult, MetricResults
from apache_beam.options.pipeline_options import PipelineOptions, PortableOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import sdk_worker

from ragpulse.judges import JudgeSpec
from ragpulse.pipeline.canaries import CanaryEvent
from ragpulse.pipeline.costs.cascade import CascadeSettings
from ragpulse.pipeline.costs.sampling import WeightedCounts
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.counting import COUNTER_NAMESPACE
from ragpulse.pipeline.records import InferenceRecord, JudgedEvent
from ragpulse.pipeline.sinks.kafka import UNACKNOWLEDGED_NAMESPACE, decode_unacknowledged
from ragpulse.pipeline.stages.judge import JudgeEvents
from ragpulse.pipeline.stages.parse import (
    LATEST_EVENT_TIME_PREFIX,
    AdmissionRules,
    ParseEvents,
)
from ragpulse.pipeline.stages.report import (
    EXEMPLAR_NAMESPACE,
    SESSION_WINDOW_NAMESPACE,
    WINDOW_NAMESPACE,
    ReportLatestFailing,
    ReportSessionWindows,
    ReportWindows,
    decode_session_window,
)
from ragpulse.pipeline.stages.review import QueueForReview, ReviewQueueConfig
from ragpulse.pipeline.stages.sessions import GroupSessions, SessionConfig, SessionKey
from ragpulse.pipeline.stages.weighted import (
    WEIGHTED_WINDOW_NAMESPACE,
    ReportWeightedWindows,
    decode_weighted_window,
)
from ragpulse.pipeline.stages.windows import ReplaceRejudged, WindowRatings
from ragpulse.pipeline.windows import RatingCounts, WindowKey, decode_window

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StageConfig:
    """How one run parses, samples, judges and windows (from the settings; picklable)."""

    judges: JudgeSpec
    # What is judged: parse, future skew, lateness (serve's cut-off of final windows), the
    # sample rate and plan, and the clock, as one value (stages/parse.py).
    admission: AdmissionRules
    judge_batch_size: int
    # The judge cascade (--cascade-llm-sample-rate); None: the backend's judges alone.
    cascade: CascadeSettings | None = None
    # Conversations judged whole (--session-judges, pipeline.stages.sessions); None: no session
    # judges.
    sessions: SessionConfig | None = None
    # The review queue (--review-rate, stages/review.py); None: nothing queued for review.
    review: ReviewQueueConfig | None = None

    @property
    def window_seconds(self) -> float:
        return self.admission.window_size

    def admitting(self, **changes: Any) -> StageConfig:
        """This configuration with `changes` to its admission rules (a cycle's clock and
        cut-off, a governed sampling plan)."""
        return dataclasses.replace(self, admission=dataclasses.replace(self.admission, **changes))


@dataclasses.dataclass(frozen=True)
class Sinks:
    """Where the graph's records go; each is a PTransform applied to a PCollection.

    `dead_letters` takes `Rejected` records; `verdicts` takes `JudgedEvent`s (only the failing
    ones with `only_failing_verdicts`); `windows` takes (WindowKey, RatingCounts) rows.
    `exemplars` reports the latest failing answer per verdict series.
    """

    dead_letters: beam.PTransform
    verdicts: beam.PTransform | None = None
    only_failing_verdicts: bool = False
    windows: beam.PTransform | None = None
    exemplars: bool = False
    evaluations: beam.PTransform | None = None  # every JudgedEvent (OTLP evaluation events)


@dataclasses.dataclass(frozen=True)
class GraphResult:
    """What one run produced, for the caller to save or print.

    `counts`: counter increments by Prometheus key; `windows`: the run's count per window (a
    partial count in serve, added to earlier cycles'); `latest_event_time`: per Kafka
    partition, the latest event time of the accepted records (the watermark's input);
    `exemplars`: the latest failing answer per verdict series; `unacknowledged`: per output
    topic, records it did not acknowledge for a reason that may clear up, and the first reason.
    `weighted_windows`: with a sampling plan, each window's verdicts weighted by 1 / sample
    rate (`pipeline.stages.weighted`); empty otherwise.
    """

    counts: counting.Counts
    windows: dict[WindowKey, RatingCounts]
    latest_event_time: dict[int, float]
    exemplars: dict[counting.CounterKey, counting.FailingExample]
    unacknowledged: dict[str, tuple[int, str]]
    weighted_windows: dict[WindowKey, WeightedCounts] = dataclasses.field(default_factory=dict)
    # serve's conversations: each judged session's own window counts, by (app, session id,
    # last turn's time), so that a late turn can replace them (pipeline.stages.sessions).
    session_windows: dict[SessionKey, dict[WindowKey, RatingCounts]] = dataclasses.field(
        default_factory=dict
    )

    @property
    def dead_letters(self) -> int:
        return self.counts[counting.key(catalogue.DEAD_LETTERS)]


def is_failing(judged: JudgedEvent) -> bool:
    """True when some judge rated the event `no` or `error`."""
    return any(v.rating in ("no", "error") for v in judged.verdicts)


def pipeline_options(beam_args: Sequence[str] = (), runner: str | None = None) -> PipelineOptions:
    """Beam options from `--runner` and `--beam-arg` values; without a runner, FnApiRunner in
    this process with one worker unless they say otherwise."""
    args = list(beam_args) + ([f"--runner={runner}"] if runner else [])
    if not any(a.startswith("--direct_num_workers") for a in args):
        args.append("--direct_num_workers=1")
    return PipelineOptions(args)


def with_sessions(
    judged: beam.PCollection,
    events: beam.PCollection,
    sessions: SessionConfig,
    batch_size: int,
    rejudge_lateness_seconds: float | None = None,
) -> beam.PCollection:
    """`judged` with the verdicts of the conversations among `events` (GroupSessions, then
    JudgeEvents of the session judges), for `run` and `stream` alike.

    `rejudge_lateness_seconds` (stream): how long after its end + gap a late turn re-opens a
    session; its re-judged verdict then replaces the earlier one (`ReplaceRejudged`: the
    earlier one comes out again as a `Retraction`). None (run: a bounded input has no late
    turns): every session is judged once."""
    grouped = events | "GroupSessions" >> GroupSessions(
        sessions, lateness_seconds=rejudge_lateness_seconds
    )
    verdicts = grouped | "JudgeSessions" >> JudgeEvents(sessions.judges, batch_size=batch_size)
    if rejudge_lateness_seconds is not None:
        verdicts = verdicts | "ReplaceRejudged" >> ReplaceRejudged(
            sessions.gap_seconds, rejudge_lateness_seconds
        )
    return (judged, verdicts) | "WithSessions" >> beam.Flatten()


def build_graph(
    p: beam.Pipeline,
    source: beam.PTransform,
    config: StageConfig,
    sinks: Sinks,
    canaries: Sequence[CanaryEvent] = (),
    sessions_due: Sequence[InferenceRecord] | None = None,
) -> None:
    """Adds the whole run to `p`: `source` yields `SourceRecord`s, `sinks` take the outputs.

    `canaries` are judged with the events and counted only in `ragpulse_canary_verdicts_total`
    (see `pipeline.canaries`). `sessions_due` (serve): the session records to judge, instead of
    grouping the events' turns into session windows here.
    """
    parsed = p | "Read" >> source | "ParseEvents" >> ParseEvents(config.admission)
    _ = parsed[ParseEvents.DEAD_LETTER] | "WriteDeadLetters" >> sinks.dead_letters
    to_judge = parsed.events
    if canaries:
        to_judge = (
            to_judge,
            p | "GoldenCanaries" >> beam.Create(list(canaries)),
        ) | "WithCanaries" >> beam.Flatten()
    answers = to_judge | "JudgeEvents" >> JudgeEvents(
        config.judges, batch_size=config.judge_batch_size, cascade=config.cascade
    )
    judged = answers
    if config.sessions is not None and sessions_due is not None:
        # serve: the conversations its state file holds and the watermark has closed
        # (pipeline/service/conversations.py), judged here with the answers; each one's
        # verdict counts are reported apart, to be replaced if a late turn re-opens it.
        verdicts = (
            p
            | "SessionsDue" >> beam.Create(list(sessions_due))
            | "JudgeSessions" >> JudgeEvents(
                config.sessions.judges, batch_size=config.judge_batch_size
            )
        )
        _ = verdicts | "ReportSessionWindows" >> ReportSessionWindows(config.window_seconds)
        judged = (answers, verdicts) | "WithSessions" >> beam.Flatten()
    elif config.sessions is not None:
        # The conversations of the sampled events, judged whole once their window closes,
        # and from here on counted, windowed and written like the answers.
        judged = with_sessions(answers, parsed.events, config.sessions, config.judge_batch_size)
    if sinks.verdicts is not None:
        to_write = (
            judged | "KeepFailing" >> beam.Filter(is_failing)
            if sinks.only_failing_verdicts
            else judged
        )
        _ = to_write | "WriteVerdicts" >> sinks.verdicts
    if sinks.evaluations is not None:
        _ = answers | "ExportEvaluations" >> sinks.evaluations
    if config.review is not None:
        _ = answers | "QueueForReview" >> QueueForReview(
            config.review, runner_retries=False, now=config.admission.now
        )
    if sinks.exemplars:
        _ = judged | "LatestFailing" >> ReportLatestFailing()
    windows = judged | "WindowRatings" >> WindowRatings(window_size=config.window_seconds)
    _ = windows | "ReportWindows" >> ReportWindows()
    if config.admission.sampling is not None:
        _ = answers | "WeightedWindows" >> ReportWeightedWindows(window_size=config.window_seconds)
    if sinks.windows is not None:
        _ = windows | "WriteWindows" >> sinks.windows


def run_graph(
    source: beam.PTransform,
    config: StageConfig,
    sinks: Sinks,
    *,
    canaries: Sequence[CanaryEvent] = (),
    options: PipelineOptions | None = None,
    sessions_due: Sequence[InferenceRecord] | None = None,
) -> GraphResult:
    """Build the graph, run it to the end, and return what it produced."""
    options = options or pipeline_options()
    # Without --runner, Beam's default (the DirectRunner) would try to download Prism first.
    runner = None if options.view_as(StandardOptions).runner else FnApiRunner()
    try:
        with own_temp_dir(beam.Pipeline(runner=runner, options=options)) as p, p:
            build_graph(p, source, config, sinks, canaries, sessions_due)
    except grpc.FutureTimeoutError:  # Beam raises it without a message
        portable = options.view_as(PortableOptions)
        raise SettingsError(
            f"the Beam job service at {portable.job_endpoint or 'the runner started'} did not "
            f"answer within {portable.job_server_timeout}s (--beam-arg=--job_endpoint, "
            "--beam-arg=--job_server_timeout)"
        ) from None
    result = decode_metrics(p.result.metrics())
    _forget_counter_names()
    return result


@contextlib.contextmanager
def own_temp_dir(p: beam.Pipeline) -> Iterator[beam.Pipeline]:
    """`p`, whose local temp folder is removed when the block ends, however it ends.

    Beam makes one (/tmp/beam-pipeline-temp*, with the artifacts it stages for cross-language
    transforms) for every Pipeline and removes it only at the end of `run()`: a pipeline whose
    building fails (a serve cycle, a stream whose Kafka reader cannot be expanded) would leave
    it behind."""
    try:
        yield p
    finally:
        shutil.rmtree(p.local_tempdir, ignore_errors=True)


def decode_metrics(metrics: MetricResults) -> GraphResult:
    """The `GraphResult` carried by a finished run's Beam metrics."""
    query = metrics.query()
    counts: counting.Counts = Counter()
    windows: dict[WindowKey, RatingCounts] = {}
    unacknowledged: dict[str, tuple[int, str]] = {}
    weighted: dict[WindowKey, WeightedCounts] = {}
    sessions: dict[SessionKey, dict[WindowKey, RatingCounts]] = {}
    for c in query["counters"]:
        namespace, name, value = c.key.metric.namespace, c.key.metric.name, int(_final(c))
        if namespace == COUNTER_NAMESPACE:
            counts[counting.decode(name)] += value
        elif namespace == WINDOW_NAMESPACE:
            key, rating = decode_window(name)
            windows[key] = windows.get(key, RatingCounts()) + RatingCounts(
                **{rating: value}
            )
        elif namespace == UNACKNOWLEDGED_NAMESPACE:
            topic, why = decode_unacknowledged(name)
            n, first = unacknowledged.get(topic, (0, why))
            unacknowledged[topic] = (n + value, first)
        elif namespace == WEIGHTED_WINDOW_NAMESPACE:
            key, part = decode_weighted_window(name, value)
            weighted[key] = weighted.get(key, WeightedCounts()) + part
        elif namespace == SESSION_WINDOW_NAMESPACE:
            session, key, rating = decode_session_window(name)
            of = sessions.setdefault(session, {})
            of[key] = of.get(key, RatingCounts()) + RatingCounts(**{rating: value})
    latest = {
        int(d.key.metric.name.removeprefix(LATEST_EVENT_TIME_PREFIX)): _final(d).max / 1000
        for d in query["distributions"]
        if d.key.metric.namespace == COUNTER_NAMESPACE
        and d.key.metric.name.startswith(LATEST_EVENT_TIME_PREFIX)
        and _final(d).count
    }
    exemplars: dict[counting.CounterKey, counting.FailingExample] = {}
    for s in query["string_sets"]:
        if s.key.metric.namespace != EXEMPLAR_NAMESPACE:
            continue
        # Several bundles may each report their latest; the latest of those wins.
        event_time, request_id = max(orjson.loads(entry) for entry in _final(s))
        exemplars[counting.decode(s.key.metric.name)] = counting.FailingExample(
            request_id, event_time
        )
    return GraphResult(counts, windows, latest, exemplars, unacknowledged, weighted, sessions)


def _final(metric: MetricResult) -> Any:
    """The metric's value in the finished run: committed, or attempted where the runner reports
    only that.

    Committed values count each bundle once, however often it was retried; the FnApiRunner,
    Beam's job service and Dataflow report them. Flink's and Spark's job servers report only
    attempted values (their accumulators): the same unless a task was retried, whose
    increments may then be counted again. Refusing those runners would leave no way to run
    there, so the values are used and the possible over-count is logged once.
    """
    if metric.committed is not None:
        return metric.committed
    _warn_attempted_only()
    return metric.attempted


@functools.cache
def _warn_attempted_only() -> None:
    log.warning(
        "this runner reports attempted metrics only: a retried task's events may be counted "
        "more than once"
    )


def _forget_counter_names() -> None:
    """Drop the counter names Beam's in-process SDK worker has cached, once the run is read.

    Beam keeps every metric name it has ever seen in a process-wide `SHORT_ID_CACHE`, never
    evicted; counter names carry the app and model labels, so each new value grew `serve` by
    ~2.5 KB per counter for good (12 MB per 1,000 new apps). Runs go one after another, and a
    finished run's short ids are never looked up again. On the other runners the SDK workers
    run in processes of their own (the portable worker pool starts one per job) and this
    process's cache is unused: replacing it does nothing there.
    """
    sdk_worker.SHORT_ID_CACHE = sdk_worker.ShortIdCache()

