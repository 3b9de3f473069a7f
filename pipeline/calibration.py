"""Judges measured against people, and pass ratios corrected for the judges' errors.

For operators who want to know how far to trust a judge, and what its pass ratio says about
the true share of good answers.

`ragpulse calibrate` (pipeline/commands/calibrate.py) judges human-labelled events and
`agreement_report` compares each verdict with its label. A labelled event is an event of the
usual schema (pipeline.formats.events) plus its human label:

    {"request_id": "r1", "request": "...", "response": "...", "retrieved_context": [...],
     "label": "no"}

`label` is "yes" or "no" for a binary judge, or an integer score for a graded scale; null means
the annotators could not agree (counted as unlabelled, left out of every figure). A golden-set
line of the canaries (`"labels": {"groundedness": "no"}`) is read too.

The report's binary figures take "yes" (pass) as the positive class: sensitivity is the share
of answers people passed that the judge passed, specificity the share of answers people failed
that the judge failed. (Hallucination detectors are often scored the other way round, with the
failing class positive: their recall is this specificity.)

`--judge-calibration FILE` (run and serve) reads the JSON that calibrate writes
(`load_calibration`) and exports, next to each window's pass ratio p, the Rogan-Gladen estimate
of the true pass ratio, (p + spec - 1) / (sens + spec - 1) clipped to [0, 1], with a 95 %
interval (`corrected_ratio`). The interval is a Monte Carlo one: the three proportions (the
window's pass ratio, sensitivity, specificity) are drawn from their Jeffreys posteriors
(Beta(k + 1/2, n - k + 1/2)), so it carries both the window's sampling error and the
calibration set's; the 2.5 and 97.5 percentiles of the corrected draws are its bounds. The seed
is fixed, so the same counts always give the same interval (no jitter between scrapes). Chosen
over the delta method because the estimate is a ratio of estimates, skewed near 0 and 1 where
pass ratios live, and the delta method's variance is 0 when a calibration count is 0 or all:
with 40 labelled passes and 25 fails, a judge of sensitivity 0.97 and specificity 0.85 and a
true pass ratio of 0.95 over 500 answers, the delta interval covered the truth 80 % of the time,
this one 97 % in 1,000 trials (tests/test_calibration.py measures the coverage). A draw in
which the judge is no better than chance (sens + spec <= 1) says nothing about the ratio: it
counts as 0 for the lower bound and 1 for the upper.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ragpulse.judges.base import Verdict
from ragpulse.judges.registry import BACKENDS
from ragpulse.pipeline.errors import kind_of

log = logging.getLogger(__name__)

# A label or a verdict: "yes"/"no" on a binary judge, an integer score on a graded scale.
Value = str | int
BINARY_VALUES = ("yes", "no")
CALIBRATION_FORMAT = 1
# Below this Youden index (sens + spec - 1) a judge's verdicts barely depend on the truth, the
# correction divides by almost nothing, and no corrected ratio is exported.
MIN_YOUDEN = 0.05
# Fewer labelled passes or fails than this and the calibration uncertainty dominates the
# interval; allowed, but said at start.
FEW_LABELLED = 30
# Enough for the bounds to move by well under a percentage point between seeds.
MC_DRAWS = 2000
MC_SEED = 20_240_914
_TAIL = 0.025  # two-sided 95 %


# ------------------------------------------------------------------ labels and verdicts


def parse_label(value: Any) -> Value | None:
    """A label as read from a line: "yes", "no", an integer score, or None (annotators could
    not agree); ValueError (one line) for anything else."""
    if value is None or value in BINARY_VALUES:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise ValueError(f'must be "yes", "no", an integer score or null, not {value!r}')


def verdict_value(verdict: Verdict, label: Value | None = None) -> Value | None:
    """What a verdict says, comparable with `label`; None when the judge could not grade.

    Against a score label, a graded judge's whole-number `score` (or a rating that is a
    number); against yes/no, the rating (chunk_relevance's score is a precision, a composite's
    a fraction: not what a yes/no label says). A judge skipped for a missing field did not
    grade either."""
    if verdict.rating in ("error", "skipped"):
        return None
    score = verdict.score
    if isinstance(label, int) and score is not None and float(score).is_integer():
        return int(score)
    rating: str = verdict.rating
    return int(rating) if rating.lstrip("-").isdigit() else rating


def agrees(label: Value, value: Value, within: int = 0) -> bool:
    """Whether a verdict `value` matches a human `label`: the same, or for scores at most
    `within` points apart."""
    if isinstance(label, int) and isinstance(value, int):
        return abs(label - value) <= within
    return label == value


def passes(value: Value, threshold: int | None) -> bool | None:
    """Whether a label or verdict is a pass: "yes", or a score of at least `threshold`; None
    for a score when no threshold is given."""
    if isinstance(value, int):
        return None if threshold is None else value >= threshold
    return value == "yes"


# ------------------------------------------------------------------ the agreement report


@dataclasses.dataclass(frozen=True, slots=True)
class Judged:
    """One labelled event and the judge's verdict on it."""

    request_id: str
    label: Value
    verdict: Verdict


@dataclasses.dataclass(frozen=True)
class AgreementReport:
    """How a judge's verdicts compare with human labels: the JSON `ragpulse calibrate` writes.

    Errors (the judge could not grade) are counted by cause and listed; they are left out of
    every figure, as they are left out of pass ratios.
    """

    judge: str
    backend: str
    model: str | None
    labelled_file: str
    pass_threshold: int | None
    # The judge's prompt version (judges.base.prompt_version): the rates hold for it alone.
    prompt_version: str | None
    unlabelled: int
    graded: int
    errors_by_cause: Mapping[str, int]
    exact_agreement: float | None
    within_one: float | None
    balanced_accuracy: float | None
    cohen_kappa: float | None
    positives: int | None
    negatives: int | None
    true_positives: int | None
    true_negatives: int | None
    sensitivity: float | None
    specificity: float | None
    confusion: Mapping[str, Mapping[str, int]]  # label -> verdict -> count
    disagreements: Sequence[Mapping[str, Any]]
    errors: Sequence[Mapping[str, Any]]
    # With --judge-logprobs, of the yes/no labels whose verdict carries P(yes): the Brier score
    # (mean squared gap between P(yes) and the label) and the expected calibration error.
    probabilities: int = 0
    brier_score: float | None = None
    expected_calibration_error: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"format": CALIBRATION_FORMAT, **dataclasses.asdict(self)}


def agreement_report(
    judged: Sequence[Judged],
    *,
    judge: str,
    backend: str,
    model: str | None,
    labelled_file: str,
    unlabelled: int = 0,
    pass_threshold: int | None = None,
    prompt_version: str | None = None,
    rationale: Callable[[str | None], str | None] = lambda text: text,
    probabilities: bool = False,
) -> AgreementReport:
    """Compare each verdict with its label. `rationale` turns a judge's rationale or error
    message into the text the report keeps (the --store-text policy). With `probabilities`
    (--judge-logprobs: binary verdicts' scores are P(yes)), the Brier score and the expected
    calibration error of those scores against the yes/no labels too."""
    pairs = [(j.label, v) for j in judged if (v := verdict_value(j.verdict, j.label)) is not None]
    errors = [j for j in judged if verdict_value(j.verdict, j.label) is None]
    confusion: dict[str, Counter[str]] = {}
    for label, value in pairs:
        confusion.setdefault(str(label), Counter())[str(value)] += 1
    scores = bool(pairs) and all(
        isinstance(label, int) and isinstance(value, int) for label, value in pairs
    )
    binary = [(passes(label, pass_threshold), passes(value, pass_threshold))
              for label, value in pairs]
    two_classes = bool(binary) and all(t is not None and p is not None for t, p in binary)
    tp = sum(1 for t, p in binary if t and p) if two_classes else None
    tn = sum(1 for t, p in binary if t is False and p is False) if two_classes else None
    positives = sum(1 for t, _ in binary if t) if two_classes else None
    negatives = len(binary) - positives if positives is not None else None
    forecasts = [
        (j.verdict.score, 1.0 if j.label == "yes" else 0.0)
        for j in judged
        if j.label in ("yes", "no") and j.verdict.rating in ("yes", "no")
        and j.verdict.score is not None
    ] if probabilities else []
    return AgreementReport(
        judge=judge,
        backend=backend,
        model=model,
        labelled_file=labelled_file,
        pass_threshold=pass_threshold,
        prompt_version=prompt_version,
        unlabelled=unlabelled,
        graded=len(pairs),
        errors_by_cause=dict(sorted(Counter(_cause(j.verdict) for j in errors).items())),
        exact_agreement=_share(agrees(label, value) for label, value in pairs),
        within_one=_share(agrees(label, value, 1) for label, value in pairs) if scores else None,
        balanced_accuracy=balanced_accuracy(pairs),
        cohen_kappa=cohen_kappa(pairs),
        positives=positives,
        negatives=negatives,
        true_positives=tp,
        true_negatives=tn,
        sensitivity=_ratio(tp, positives),
        specificity=_ratio(tn, negatives),
        confusion={label: dict(sorted(row.items())) for label, row in sorted(confusion.items())},
        disagreements=[
            {
                "request_id": j.request_id,
                "label": j.label,
                "verdict": verdict_value(j.verdict, j.label),
                "rationale": rationale(j.verdict.rationale) if j.verdict.rationale else None,
            }
            for j in judged
            if (v := verdict_value(j.verdict, j.label)) is not None and not agrees(j.label, v)
        ],
        errors=[
            {
                "request_id": j.request_id,
                "label": j.label,
                "cause": _cause(j.verdict),
                "error_message": rationale(j.verdict.error_message),
            }
            for j in errors
        ],
        probabilities=len(forecasts),
        brier_score=brier_score(forecasts),
        expected_calibration_error=expected_calibration_error(forecasts),
    )


def brier_score(forecasts: Sequence[tuple[float, float]]) -> float | None:
    """Mean of (p - y)^2 over (P(yes), 1 if labelled yes else 0) pairs; None without any."""
    if not forecasts:
        return None
    return sum((p - y) ** 2 for p, y in forecasts) / len(forecasts)


def expected_calibration_error(
    forecasts: Sequence[tuple[float, float]], bins: int = 10
) -> float | None:
    """The expected calibration error over `bins` equal-width bins of P(yes): the share-
    weighted gap between each bin's mean P(yes) and its share labelled yes."""
    if not forecasts:
        return None
    binned: dict[int, list[tuple[float, float]]] = {}
    for p, y in forecasts:
        binned.setdefault(min(int(p * bins), bins - 1), []).append((p, y))
    return sum(
        len(group) / len(forecasts)
        * abs(sum(p for p, _ in group) / len(group) - sum(y for _, y in group) / len(group))
        for group in binned.values()
    )


def _cause(verdict: Verdict) -> str:
    """Why a verdict has no value: its error cause, or `skipped` (a required field missing)."""
    if verdict.rating == "skipped":
        return "skipped"
    return verdict.error_cause or "internal"


def _share(hits: Iterable[bool]) -> float | None:
    flags = list(hits)
    return sum(flags) / len(flags) if flags else None


def _ratio(k: int | None, n: int | None) -> float | None:
    return k / n if k is not None and n else None


def balanced_accuracy(pairs: Sequence[tuple[Value, Value]]) -> float | None:
    """Mean over the label classes of the share of that class the judge got right (None with
    fewer than two classes: it would be plain accuracy on one class)."""
    by_class: dict[Value, list[bool]] = {}
    for label, value in pairs:
        by_class.setdefault(label, []).append(agrees(label, value))
    if len(by_class) < 2:
        return None
    return sum(sum(hits) / len(hits) for hits in by_class.values()) / len(by_class)


def cohen_kappa(pairs: Sequence[tuple[Value, Value]]) -> float | None:
    """Cohen's kappa (unweighted) of the labels and the verdicts: (observed - chance agreement)
    / (1 - chance); None without pairs, or when chance agreement is certain (one category)."""
    return kappa_of(Counter(pairs))


def kappa_of(confusion: Mapping[tuple[Value, Value], int]) -> float | None:
    """Cohen's kappa of a confusion table ({(label, verdict): count}); see `cohen_kappa`."""
    n = sum(confusion.values())
    if n == 0:
        return None
    observed = sum(k for (label, value), k in confusion.items() if agrees(label, value)) / n
    labels: Counter[Value] = Counter()
    values: Counter[Value] = Counter()
    for (label, value), k in confusion.items():
        labels[label] += k
        values[value] += k
    chance = sum(labels[c] * values[c] for c in labels) / (n * n)
    if chance >= 1.0:
        return None
    return (observed - chance) / (1 - chance)


Agreement = Callable[[Sequence[tuple[Value, Value]]], float | None]


@dataclasses.dataclass(frozen=True, slots=True)
class Interval:
    """A figure and its 95 % percentile-bootstrap interval (low, high: None when too few
    resamples define the figure, e.g. every resample held one class)."""

    value: float | None
    low: float | None
    high: float | None


def bootstrap_interval(
    pairs: Sequence[tuple[Value, Value]], figure: Agreement, draws: int = MC_DRAWS
) -> Interval:
    """`figure` (balanced_accuracy, cohen_kappa) of (label, verdict) pairs, with the 2.5 and
    97.5 percentiles of the figure over `draws` resamples of the pairs with replacement. The
    seed is fixed: the same pairs always give the same interval."""
    return _bootstrap(len(pairs), lambda rows: figure([pairs[i] for i in rows]), draws)


def paired_difference_interval(
    triples: Sequence[tuple[Value, Value, Value]], figure: Agreement, draws: int = MC_DRAWS
) -> Interval:
    """figure(after) - figure(before) over (label, before, after) triples of the same items,
    with its bootstrap interval: each resample draws items, so both figures move together and
    the interval is that of the change, narrower than two separate intervals suggest."""

    def change(rows: Sequence[int]) -> float | None:
        before = figure([(triples[i][0], triples[i][1]) for i in rows])
        after = figure([(triples[i][0], triples[i][2]) for i in rows])
        return None if before is None or after is None else after - before

    return _bootstrap(len(triples), change, draws)


def _bootstrap(
    n: int, statistic: Callable[[Sequence[int]], float | None], draws: int
) -> Interval:
    value = statistic(range(n)) if n else None
    if value is None:
        return Interval(None, None, None)
    rng = np.random.default_rng(MC_SEED)
    found = [
        s for rows in rng.integers(0, n, size=(draws, n))
        if (s := statistic(rows.tolist())) is not None
    ]
    if len(found) < draws // 2:  # most resamples leave the figure undefined: no interval
        return Interval(value, None, None)
    low, high = np.percentile(found, [100 * _TAIL, 100 * (1 - _TAIL)])
    return Interval(value, min(float(low), value), max(float(high), value))

@dataclasses.dataclass(frozen=True, slots=True)
class Confusion:
    """A binary judge against people, as counts: `yes_yes` labelled pass and passed by the
    judge, `yes_no` labelled pass and failed, `no_yes` labelled fail and passed, `no_no`
    labelled fail and failed (serve keeps them from the reviewers' labels, docs/review.md)."""

    yes_yes: int = 0
    yes_no: int = 0
    no_yes: int = 0
    no_no: int = 0

    @property
    def labelled(self) -> int:
        return self.yes_yes + self.yes_no + self.no_yes + self.no_no

    @property
    def sensitivity(self) -> float | None:
        return _ratio(self.yes_yes, self.yes_yes + self.yes_no)

    @property
    def specificity(self) -> float | None:
        return _ratio(self.no_no, self.no_yes + self.no_no)

    @property
    def kappa(self) -> float | None:
        return kappa_of({
            ("yes", "yes"): self.yes_yes, ("yes", "no"): self.yes_no,
            ("no", "yes"): self.no_yes, ("no", "no"): self.no_no,
        })


def with_labels(
    seed: JudgeCalibration | None,
    judge: str,
    prompt_version: str,
    labels: Confusion,
    backend: str,
    model: str | None,
) -> JudgeCalibration | None:
    """A judge's error rates from its calibration file (`seed`, when there is one for the
    running prompt version) and the reviewers' labels of the uniform random slice together,
    their counts added; None while the two hold no labelled pass or no labelled fail."""
    if not labels.labelled:
        return seed
    base = seed or JudgeCalibration(judge, backend, model, "", 0, 0, 0, 0, prompt_version)
    merged = dataclasses.replace(
        base,
        source=f"{base.source} + {labels.labelled} review labels".lstrip(" +"),
        positives=base.positives + labels.yes_yes + labels.yes_no,
        true_positives=base.true_positives + labels.yes_yes,
        negatives=base.negatives + labels.no_yes + labels.no_no,
        true_negatives=base.true_negatives + labels.no_no,
    )
    return merged if merged.positives and merged.negatives else None


# ------------------------------------------------------------------ calibration files


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the key."""


@dataclasses.dataclass(frozen=True, slots=True)
class JudgeCalibration:
    """A judge's error rates on a labelled set, from the counts they rest on."""

    judge: str
    backend: str
    model: str | None
    source: str  # the file it was read from
    positives: int  # labelled passes the judge graded
    true_positives: int  # of those, passed by the judge
    negatives: int  # labelled fails the judge graded
    true_negatives: int  # of those, failed by the judge
    prompt_version: str  # of the judge measured: another version has other error rates

    @property
    def sensitivity(self) -> float:
        return self.true_positives / self.positives

    @property
    def specificity(self) -> float:
        return self.true_negatives / self.negatives

    @property
    def youden(self) -> float:
        """sens + spec - 1: how much the judge's verdicts depend on the truth."""
        return self.sensitivity + self.specificity - 1

    @property
    def corrects(self) -> bool:
        """Whether a corrected ratio is defined (the judge is clearly better than chance)."""
        return self.youden > MIN_YOUDEN


def load_calibration(path: Path) -> JudgeCalibration:
    """Read and validate a file `ragpulse calibrate --output` wrote; CalibrationError names the
    file and the key that is wrong."""
    try:
        data = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise CalibrationError(
            f"calibration file {path}: cannot read it ({exc.strerror})"
        ) from None
    except orjson.JSONDecodeError as exc:
        raise CalibrationError(f"calibration file {path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"calibration file {path}: not a JSON object")

    def bad(key: str, why: str) -> CalibrationError:
        return CalibrationError(f"calibration file {path}, key {key!r}: {why}")

    if data.get("format") != CALIBRATION_FORMAT:
        raise bad("format", f"must be {CALIBRATION_FORMAT} (a file `ragpulse calibrate` wrote)")
    for key in ("judge", "backend"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise bad(key, "must be a non-empty string")
    if data["backend"] not in BACKENDS:
        raise bad("backend", f"must be one of {', '.join(BACKENDS)}")
    if data.get("model") is not None and not isinstance(data["model"], str):
        raise bad("model", "must be a string or null")
    if not isinstance(data.get("prompt_version"), str) or not data["prompt_version"]:
        raise bad("prompt_version", "missing: the file does not say which prompt version it "
                  "measured; run `ragpulse calibrate` again")
    counts = {}
    for key in ("positives", "true_positives", "negatives", "true_negatives"):
        value = data.get(key)
        if value is None:
            raise bad(key, "missing or null: the labelled set needs both passes and fails "
                      "(and, on a graded scale, --pass-threshold)")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise bad(key, f"must be an integer >= 0, not {kind_of(value)}")
        counts[key] = value
    for total, part in (("positives", "true_positives"), ("negatives", "true_negatives")):
        if counts[total] == 0:
            raise bad(total, "is 0: sensitivity and specificity need labelled passes and fails")
        if counts[part] > counts[total]:
            raise bad(part, f"is above {total} ({counts[part]} > {counts[total]})")
    return JudgeCalibration(
        judge=data["judge"], backend=data["backend"], model=data.get("model"), source=str(path),
        prompt_version=data["prompt_version"], **counts,
    )


def load_calibrations(files: Sequence[Path | JudgeCalibration]) -> tuple[JudgeCalibration, ...]:
    """The calibrations of --judge-calibration `files` (a value loaded already is kept as it
    is), one per judge: CalibrationError (one line, naming the file) for a file that cannot be
    used or a judge calibrated twice."""
    loaded = tuple(f if isinstance(f, JudgeCalibration) else load_calibration(Path(f))
                   for f in files)
    seen: dict[str, str] = {}
    for c in loaded:
        if c.judge in seen:
            raise CalibrationError(
                f"judge {c.judge!r} is calibrated twice ({seen[c.judge]}, {c.source})"
            )
        seen[c.judge] = c.source
    return loaded


def check_calibrations(
    calibrations: Sequence[JudgeCalibration],
    judges: Sequence[str],
    backend: str,
    model: str,
    versions: Mapping[str, str] | Callable[[], Mapping[str, str]] = lambda: {},
) -> None:
    """ValueError (one line) unless each calibration is for a judge in use, on the backend in
    use, of the prompt version in use (`versions`: each judge's, or a function giving them);
    logs what each one does (or why it does nothing) once, at start."""
    for c in calibrations:
        if c.judge not in judges:
            raise ValueError(f"{c.source} calibrates judge {c.judge!r}, which is not in --judges")
        if c.backend != backend:
            # Another implementation has other error rates: the correction would be wrong.
            raise ValueError(
                f"{c.source} measured {c.judge} on the {c.backend} backend; this run uses "
                f"{backend}"
            )
        if callable(versions):
            versions = versions()
        version = versions.get(c.judge)
        if version is not None and version != c.prompt_version:
            # A changed prompt has other error rates: correcting with the old ones would be
            # silently wrong.
            raise ValueError(
                f"{c.source} measured {c.judge} with prompt version {c.prompt_version}; this run "
                f"uses {version}: run `ragpulse calibrate` again with this prompt"
            )
        if backend == "openai" and c.model is not None and c.model != model:
            log.warning("%s measured %s with model %s; this run uses %s: its error rates may "
                        "differ", c.source, c.judge, c.model, model)
        describe_calibration(c)


def describe_calibration(c: JudgeCalibration) -> None:
    """Log, once at start, what a calibration file does to its judge's pass ratio (or why it
    does nothing)."""
    if not c.corrects:
        log.warning(
            "%s: %s has sensitivity %.3f and specificity %.3f (sens + spec - 1 = %.3f, not "
            "above %g): its verdicts barely depend on the truth, so no corrected pass "
            "ratio is exported for it", c.source, c.judge, c.sensitivity, c.specificity,
            c.youden, MIN_YOUDEN)
        return
    log.info("%s: %s pass ratios corrected with sensitivity %.3f (%d/%d) and specificity "
             "%.3f (%d/%d)", c.source, c.judge, c.sensitivity, c.true_positives, c.positives,
             c.specificity, c.true_negatives, c.negatives)
    if min(c.positives, c.negatives) < FEW_LABELLED:
        log.warning("%s: only %d labelled passes and %d fails: the corrected intervals "
                    "will be wide", c.source, c.positives, c.negatives)


# ------------------------------------------------------------------ the corrected ratio


@dataclasses.dataclass(frozen=True, slots=True)
class CorrectedRatio:
    """The Rogan-Gladen pass ratio and its 95 % interval (see the module docstring)."""

    value: float
    low: float
    high: float


def rogan_gladen(p: float, sensitivity: float, specificity: float) -> float:
    """The true pass ratio that an observed pass ratio `p` implies, clipped to [0, 1]."""
    return min(1.0, max(0.0, (p + specificity - 1) / (sensitivity + specificity - 1)))


def corrected_ratio(yes: int, graded: int, c: JudgeCalibration) -> CorrectedRatio | None:
    """The corrected pass ratio of `yes` passes out of `graded` verdicts; None when there is
    no verdict or the judge is too close to chance (`JudgeCalibration.corrects`)."""
    if graded == 0 or not c.corrects:
        return None
    return _corrected(yes, graded, c.true_positives, c.positives, c.true_negatives, c.negatives)


@functools.lru_cache(maxsize=4096)
def _corrected(yes: int, n: int, tp: int, pos: int, tn: int, neg: int) -> CorrectedRatio:
    # Cached: a scrape asks again for the same counts until the next window closes.
    rng = np.random.default_rng(MC_SEED)
    p = rng.beta(yes + 0.5, n - yes + 0.5, MC_DRAWS)
    sens = rng.beta(tp + 0.5, pos - tp + 0.5, MC_DRAWS)
    spec = rng.beta(tn + 0.5, neg - tn + 0.5, MC_DRAWS)
    youden = sens + spec - 1
    informative = youden > 0
    ratio = np.clip((p + spec - 1) / np.where(informative, youden, 1.0), 0.0, 1.0)
    k = int(_TAIL * MC_DRAWS)  # order statistics of the two bounds
    low = float(np.partition(np.where(informative, ratio, 0.0), k)[k])
    high = float(np.partition(np.where(informative, ratio, 1.0), MC_DRAWS - 1 - k)[-1 - k])
    value = rogan_gladen(yes / n, tp / pos, tn / neg)
    # The percentile interval of a skewed draw can miss the point estimate by a hair.
    return CorrectedRatio(value, min(low, value), max(high, value))


def corrected_fields(
    judge: str, yes: int, graded: int, calibrations: Mapping[str, JudgeCalibration]
) -> dict[str, float | None]:
    """The `windows.jsonl` fields of a calibrated judge's window (none for the others)."""
    c = calibrations.get(judge)
    if c is None or not c.corrects:
        return {}
    r = corrected_ratio(yes, graded, c)
    return {
        "corrected_percentage": r.value if r else None,
        "corrected_ci_low": r.low if r else None,
        "corrected_ci_high": r.high if r else None,
    }


def by_judge(calibrations: Sequence[JudgeCalibration]) -> dict[str, JudgeCalibration]:
    """The calibrations keyed by judge name."""
    return {c.judge: c for c in calibrations}
