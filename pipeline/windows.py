"""Event-time window arithmetic and the statistics reported per window.

Pure functions shared by the file run, `serve` and the state store, so that a window's bounds
and its percentage mean the same thing everywhere.
"""

from __future__ import annotations

import dataclasses
import math
import re
from datetime import UTC, datetime

import orjson

from ragpulse.pipeline.errors import SettingsError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

# 95 % two-sided normal quantile.
Z_95 = 1.959963984540054


def parse_duration(text: str) -> float:
    """Seconds in a duration such as `90s`, `5m`, `1.5h` or `250ms`; ValueError otherwise."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} is not a duration: use a number and a unit (ms, s, m, h, d), e.g. 60s or 5m"
        )
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if not math.isfinite(seconds):  # 400 digits make an infinite float
        raise ValueError(f"{text!r} is too long a duration")
    return seconds


def parse_time(text: str, flag: str = "--since") -> float:
    """Epoch seconds from epoch seconds or ISO 8601 text (no zone means UTC); SettingsError
    naming `flag` otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise SettingsError(f"{flag} {text!r} is neither ISO 8601 nor epoch seconds") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def window_start(event_time: float, size: float) -> float:
    """Start of the fixed `size`-second window holding `event_time` (epoch-aligned, like Beam)."""
    return math.floor(event_time / size) * size


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float | None, float | None]:
    """Wilson score interval for a binomial proportion; (None, None) when n == 0.

    Chosen over the normal approximation because windows often hold few samples and pass
    ratios sit near 1, where the normal interval leaves [0, 1].
    """
    if n == 0:
        return None, None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def isoformat_utc(epoch_seconds: float) -> str:
    """ISO 8601 text in UTC with a `Z` suffix, as written to every output."""
    return datetime.fromtimestamp(epoch_seconds, tz=UTC).isoformat().replace("+00:00", "Z")


@dataclasses.dataclass(frozen=True, slots=True)
class WindowKey:
    """Identifies one row of windowed ratings."""

    window_start: float
    window_end: float
    judge: str
    app: str
    model: str
    # The judge's prompt version (judges.base.prompt_version): windows of two prompts of one
    # judge are two rows, never added up.
    version: str = ""

    @property
    def guideline(self) -> str:
        """The named guideline of a per-guideline judge ("<judge>/<name>"), else ""."""
        return self.judge.partition("/")[2]


@dataclasses.dataclass(frozen=True, slots=True)
class RatingCounts:
    """How many verdicts of each rating; adds up across partial counts of the same window."""

    yes: int = 0
    no: int = 0
    error: int = 0
    # Of the graded verdicts, those of a graded scale (0-3, 1-5, a composite), and the sum of
    # their scores in thousandths (an integer, so partial counts add up exactly).
    scored: int = 0
    score_milli: int = 0

    def __add__(self, other: RatingCounts) -> RatingCounts:
        return RatingCounts(
            self.yes + other.yes,
            self.no + other.no,
            self.error + other.error,
            self.scored + other.scored,
            self.score_milli + other.score_milli,
        )

    @property
    def graded(self) -> int:
        """Verdicts that count towards the percentage (errors do not)."""
        return self.yes + self.no

    @property
    def score_mean(self) -> float | None:
        """The mean score of the scored verdicts (None when there are none)."""
        return self.score_milli / 1000 / self.scored if self.scored else None


def encode_window(key: WindowKey, field: str) -> str:
    """The name of one window's count of `field` (a `RatingCounts` field, or a weighted count's
    rating), as the Beam counters that carry window counts out of the workers spell it."""
    return orjson.dumps(
        [key.window_start, key.window_end, key.judge, key.app, key.model, key.version, field]
    ).decode()


def decode_window(name: str) -> tuple[WindowKey, str]:
    """Inverse of `encode_window`."""
    start, end, judge, app, model, version, field = orjson.loads(name)
    return WindowKey(float(start), float(end), judge, app, model, version), field


def window_row(key: WindowKey, counts: RatingCounts) -> dict[str, object]:
    """The `windows.jsonl` row: counts, percentage = yes / (yes + no) (for a graded scale, the
    share at or above its pass score), its Wilson interval, and a graded scale's mean score."""
    n = counts.graded
    ci_low, ci_high = wilson_interval(counts.yes, n)
    return {
        "window_start": isoformat_utc(key.window_start),
        "window_end": isoformat_utc(key.window_end),
        "judge": key.judge,
        "version": key.version,
        "app": key.app,
        "model": key.model,
        "yes": counts.yes,
        "no": counts.no,
        "error": counts.error,
        "percentage": counts.yes / n if n else None,
        "ci_low": ci_low,
        "ci_high": ci_high,
        "scored": counts.scored,
        "score_mean": counts.score_mean,
    }
