"""The review queue's stage: which judged events go to a person, as review items, and how many.

`QueueForReview` is a branch of the graphs of `serve` and `stream` (graphs/bounded.py,
graphs/unbounded.py) after the judges, ending in the review topic's sink:

    JudgedEvent -> SelectForReview (queue_reason, review_item) -> BoundPerHour -> ToReviewRecord
                -> PublishReviewItems (sinks/kafka.py)

`queue_reason` is the one decision of what is queued and why (pure, tested on its own):

* `random`: a uniform slice of the judged events, `--review-rate`, decided by a hash of the
  event id salted apart from the sampler's (costs/sampling.py), so the slice is independent of
  which events were judged and the same on every runner and replay. Only these items estimate a
  judge's error rates.
* targeted, kept apart from that estimate, in this order: `disagreement` (the cascade's local
  and LLM tiers rated the event differently, costs/cascade.py), `unsure` (a binary verdict's
  P(yes) within `--review-unsure-band` of 0.5, judges/llm/logprobs.py), `failing` (a judge
  rated the answer `no`). Whether the window of a failing verdict pages is decided later, by
  Prometheus's rules over the closed window, so it cannot be known here: every failing verdict
  is a candidate, and the hourly bound keeps their number in check.

`--review-max-per-hour N` bounds the items queued per hour of event time (per process: serve's,
or each stream worker's), targeted items at most half of it, so a bad day's failures never crowd
out the random slice, and a day of traffic queues at most 24 N items however it is read (live,
or a backlog caught up at once); what the bound held back is counted in
`ragpulse_review_held_back_total`. Event time rather than the clock also makes the bound the
same on a replay of the same records.
A review item over the page's limit (formats/review.py) is refused and counted in
`ragpulse_review_refused_total` with its reason, never cut, and published to the review topic's
dead-letter topic (REVIEW_TOPIC.dlq, where the page puts what it cannot show) with that reason.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar

import apache_beam as beam
import orjson
from pydantic import ValidationError

from ragpulse.judges import TextPolicy
from ragpulse.judges.base import Verdict
from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.costs.sampling import sample_point
from ragpulse.pipeline.formats.review import (
    JudgeView,
    QueueReason,
    ReviewChunk,
    ReviewItem,
    TargetedReason,
    encode_item,
)
from ragpulse.pipeline.formats.verdict_rows import verdict_row
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import JudgedEvent, QueuedVerdict
from ragpulse.pipeline.sinks.kafka import (
    KafkaTopic,
    PublishReviewDeadLetters,
    PublishReviewItems,
    review_dead_letter,
)
from ragpulse.pipeline.stages.counters import Counters
from ragpulse.pipeline.windows import window_start

log = logging.getLogger(__name__)

QUEUED = catalogue.REVIEW_QUEUED
HELD_BACK = catalogue.REVIEW_HELD_BACK
REFUSED = catalogue.REVIEW_REFUSED
# The random slice's hash is salted so that it is independent of the sampler's decision.
_SALT = "review\0"
# Hours of event time whose counts the bound keeps (late events of a recent hour still count).
_HOURS_KEPT = 48


@dataclasses.dataclass(frozen=True)
class ReviewQueueConfig:
    """What the review queue takes (from --review-* and the judges' settings; picklable).

    `p_yes_judges`: the judges whose verdict score is P(yes) (binary scale, --judge-logprobs);
    `scales`: the scores of the judges on a graded scale. `target`: the review topic."""

    target: KafkaTopic
    rate: float
    targets: tuple[TargetedReason, ...]
    unsure_band: float
    max_per_hour: int
    window_seconds: float
    policy: TextPolicy
    p_yes_judges: frozenset[str] = frozenset()
    scales: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    # Where items that cannot be queued go, with their reason (REVIEW_TOPIC.dlq); None: counted
    # and logged only.
    dead_letters: KafkaTopic | None = None


def in_random_slice(event_id: str, rate: float) -> bool:
    """Whether the event is in the uniform review slice at `rate` (a salted hash of its id)."""
    return rate > 0 and sample_point(_SALT + event_id) < rate


def _reviewable(verdicts: tuple[Verdict, ...]) -> list[Verdict]:
    # `skipped` judges did not grade; a verdict with parts is reviewed by its parts.
    flat = [p for v in verdicts for p in (v.parts or (v,))]
    return [v for v in flat if v.rating in ("yes", "no", "error")]


def queue_reason(
    judged: JudgedEvent, config: ReviewQueueConfig
) -> tuple[QueueReason, tuple[str, ...]] | None:
    """Why `judged` goes to review and the judges that made it so (none for `random`), or None.

    Random first: an event in the slice is a random item whatever else it is, so the slice stays
    a uniform sample of the judged events."""
    if judged.record.session is not None:
        return None  # a conversation's transcript is not an answer to review (docs/review.md)
    verdicts = _reviewable(judged.verdicts)
    if not verdicts:
        return None
    if in_random_slice(judged.record.request_id, config.rate):
        return "random", ()
    for target in config.targets:
        judges = tuple(v.judge for v in verdicts if _targets(v, target, config))
        if judges:
            return target, judges
    return None


def _targets(v: Verdict, target: TargetedReason, config: ReviewQueueConfig) -> bool:
    if target == "disagreement":
        return v.other_tier_rating is not None
    if target == "unsure":
        return (
            v.judge in config.p_yes_judges
            and v.score is not None
            and abs(v.score - 0.5) < config.unsure_band
        )
    return v.rating == "no"


def review_item(
    judged: JudgedEvent,
    reason: QueueReason,
    reason_judges: tuple[str, ...],
    config: ReviewQueueConfig,
    now: float,
) -> ReviewItem:
    """The review item of `judged`: its text redacted as judge prompts are (--redact-pii), its
    rationales kept as verdict rows keep them (--store-text)."""
    record = judged.record
    policy = config.policy
    item = record.judge_input
    redacted = policy.redacts_prompts
    if redacted:
        item = policy.redactor().judge_input(item)
    row = verdict_row(judged, policy)  # rationales and error messages as the policy allows
    flat = [p for v in judged.verdicts for p in (v.parts or (v,))]
    versions = {v.judge: row.get(f"response/llm_judged/{v.judge}/version", "") for v in flat}
    views = []
    for v in _reviewable(judged.verdicts):
        base = f"response/llm_judged/{v.judge}"
        p_yes = v.score if v.judge in config.p_yes_judges else None
        views.append(
            JudgeView(
                judge=v.judge,
                rating=v.rating,  # _reviewable: yes, no or error
                rationale=row.get(f"{base}/rationale"),
                error_message=row.get(f"{base}/error_message"),
                prompt_version=versions.get(v.judge, ""),
                p_yes=p_yes,
                score=None if p_yes is not None else v.score,
                scale=config.scales.get(v.judge),
                other_tier_rating=v.other_tier_rating,
            )
        )
    start = window_start(record.event_time, config.window_seconds)
    return ReviewItem(
        event_id=record.request_id,
        app=record.app,
        model=record.model,
        event_time=_utc(record.event_time),
        window_start=_utc(start),
        window_end=_utc(start + config.window_seconds),
        reason=reason,
        reason_judges=reason_judges,
        request=item.question,
        response=item.answer,
        chunks=tuple(ReviewChunk(content=c.content, doc_uri=c.doc_uri) for c in item.chunks),
        verdicts=tuple(views),
        redacted=redacted,
        queued_at=_utc(now),
    )


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


class HourlyBound:
    """At most `limit` items per hour of event time and review topic in this process, targeted
    items at most half of them. Shared by every bundle and (serve) every cycle of the process;
    the counts of the latest hours are kept (`_HOURS_KEPT`), older ones forgotten."""

    _lock = threading.Lock()
    _taken: ClassVar[dict[tuple[str, int], list[int]]] = {}  # (topic, hour) -> [all, targeted]

    @classmethod
    def take(cls, topic: str, random: bool, limit: int, event_time: float) -> bool:
        """Whether one more item of `event_time` may be queued; counts it when it may."""
        hour = int(event_time // 3600)
        with cls._lock:
            if (topic, hour) not in cls._taken:
                hours = sorted(k for k in cls._taken if k[0] == topic)
                for key in hours[: max(0, len(hours) + 1 - _HOURS_KEPT)]:
                    del cls._taken[key]
            taken = cls._taken.setdefault((topic, hour), [0, 0])
            if taken[0] >= limit or (not random and taken[1] >= limit // 2):
                return False
            taken[0] += 1
            taken[1] += 0 if random else 1
            return True

    @classmethod
    def reset(cls) -> None:
        """Forget every hour's count (tests)."""
        with cls._lock:
            cls._taken.clear()


REFUSED_ITEMS = "refused"  # the tag of the items that cannot be queued
QUEUED_VERDICTS = "queued_verdicts"  # the tag of each queued item's verdicts (stages/labels.py)


def _what_is_wrong(exc: ValueError) -> str:
    """The field at fault and why, without the value (user text, possibly huge)."""
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        return f"{'.'.join(str(p) for p in error['loc']) or 'item'}: {error['msg']}"
    return " ".join(str(exc).split())[:500]


class _SelectForReview(beam.DoFn):
    """Each judged event that goes to review, bounded per hour, as (event id, item bytes)."""

    def __init__(self, config: ReviewQueueConfig, now: float | None) -> None:
        self._config = config
        self._now = now

    def setup(self) -> None:
        self._counters = Counters()

    def process(self, judged: JudgedEvent) -> Iterator[Any]:
        config = self._config
        chosen = queue_reason(judged, config)
        if chosen is None:
            return
        reason, judges = chosen
        now = self._now if self._now is not None else time.time()
        if not HourlyBound.take(config.target.topic, reason == "random", config.max_per_hour,
                                judged.record.event_time):
            self._counters.inc(counting.key(HELD_BACK, reason=reason))
            return
        try:
            item = review_item(judged, reason, judges, config, now)
        except ValueError as exc:  # pydantic's ValidationError: e.g. a judge name too long
            log.warning("review item of event %.200s refused: %s", judged.record.request_id, exc)
            self._counters.inc(counting.key(REFUSED, reason="invalid"))
            event_id = judged.record.request_id.encode("utf-8", errors="replace")
            yield beam.pvalue.TaggedOutput(REFUSED_ITEMS, review_dead_letter(
                orjson.dumps({"event_id": judged.record.request_id, "reason": reason}),
                event_id, f"invalid: {_what_is_wrong(exc)}",
            ))
            return
        try:
            key, value = encode_item(item)
        except ValueError as exc:
            log.warning("review item of event %.200s refused: %s", item.event_id, exc)
            self._counters.inc(counting.key(REFUSED, reason="too_large"))
            yield beam.pvalue.TaggedOutput(REFUSED_ITEMS, review_dead_letter(
                item.model_dump_json().encode(), item.event_id.encode("utf-8"),
                f"too_large: {exc}",
            ))
            return
        self._counters.inc(counting.key(QUEUED, reason=reason))
        for view in item.verdicts:
            yield beam.pvalue.TaggedOutput(
                QUEUED_VERDICTS, QueuedVerdict(item.event_id, view.judge, view.prompt_version)
            )
        yield key, value


@composite_transform
def QueueForReview(
    judged: Any, config: ReviewQueueConfig, *, runner_retries: bool, now: float | None = None
) -> Any:
    """Branch of the graph: the judged events queued for review (`queue_reason`), bounded per
    hour, published as review items to `config.target` (`runner_retries`: as the stream's
    sinks, see sinks/kafka.py). `now`: the items' `queued_at` (serve: the cycle's start); None
    reads the clock per item. Returns the verdicts of the items queued (`QueuedVerdict`s),
    which the stream checks its reviewers' labels against (stages/labels.py)."""
    chosen = judged | "SelectForReview" >> beam.ParDo(_SelectForReview(config, now)).with_outputs(
        REFUSED_ITEMS, QUEUED_VERDICTS, main="items"
    )
    if config.dead_letters is not None:
        _ = chosen[REFUSED_ITEMS] | "PublishRefusedItems" >> PublishReviewDeadLetters(
            config.dead_letters, runner_retries=runner_retries
        )
    _ = chosen["items"] | "PublishReviewItems" >> PublishReviewItems(
        config.target, runner_retries=runner_retries
    )
    return chosen[QUEUED_VERDICTS]

