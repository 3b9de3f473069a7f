"""The Prometheus exposition, read back through a private registry."""

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for, write_textfile
from ragpulse.pipeline.windows import RatingCounts, WindowKey


def snapshot() -> MetricsSnapshot:
    counts = counting.merge(
        {
            counting.key("ragpulse_events_total", outcome="accepted"): 10,
            counting.key(
                "ragpulse_judge_verdicts_total",
                judge="groundedness",
                rating="yes",
                app="a",
                model="m",
            ): 7,
            counting.key(counting.LATENCY_BUCKET, judge="groundedness", le="0.001"): 3,
            counting.key(counting.LATENCY_BUCKET, judge="groundedness", le="+Inf"): 1,
            counting.key(counting.LATENCY_SUM_US, judge="groundedness"): 40_000_000,
            counting.key(counting.LATENCY_COUNT, judge="groundedness"): 4,
        }
    )
    complete = {
        WindowKey(0, 60, "groundedness", "a", "m"): RatingCounts(yes=1, no=1),
        WindowKey(60, 120, "groundedness", "a", "m"): RatingCounts(yes=3, no=1, error=5),
        WindowKey(60, 120, "safety", "a", "m"): RatingCounts(error=2),
    }
    in_progress = {WindowKey(120, 180, "groundedness", "a", "m"): RatingCounts(yes=2)}
    return MetricsSnapshot(
        counts,
        complete,
        in_progress,
        gauges={"ragpulse_heartbeat_timestamp_seconds": 123.0},
        lag={("t", 0): 5},
    )


def test_pass_ratio_is_the_latest_complete_window_with_errors_left_out() -> None:
    reg = registry_for(snapshot)
    labels = {"judge": "groundedness", "version": "", "app": "a", "model": "m"}
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", labels) == 0.75
    assert reg.get_sample_value("ragpulse_judge_window_samples", labels) == 4
    low = reg.get_sample_value("ragpulse_judge_pass_ratio_ci_low", labels)
    high = reg.get_sample_value("ragpulse_judge_pass_ratio_ci_high", labels)
    assert low is not None and high is not None and low < 0.75 < high


def test_window_with_only_errors_exports_zero_samples_and_no_ratio() -> None:
    reg = registry_for(snapshot)
    labels = {"judge": "safety", "version": "", "app": "a", "model": "m"}
    assert reg.get_sample_value("ragpulse_judge_window_samples", labels) == 0
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", labels) is None


def test_in_progress_window_is_exported_apart_from_the_complete_one() -> None:
    reg = registry_for(snapshot)
    labels = {"judge": "groundedness", "version": "", "app": "a", "model": "m"}
    assert reg.get_sample_value("ragpulse_judge_in_progress_pass_ratio", labels) == 1.0
    assert reg.get_sample_value("ragpulse_judge_in_progress_window_samples", labels) == 2


def test_counters_are_exported_with_total_suffix_and_known_ones_start_at_zero() -> None:
    reg = registry_for(snapshot)
    assert reg.get_sample_value("ragpulse_events_total", {"outcome": "accepted"}) == 10
    assert reg.get_sample_value("ragpulse_events_total", {"outcome": "invalid"}) == 0
    assert reg.get_sample_value("ragpulse_late_events_total") == 0
    assert (
        reg.get_sample_value(
            "ragpulse_judge_verdicts_total",
            {"judge": "groundedness", "rating": "yes", "app": "a", "model": "m"},
        )
        == 7
    )


def test_latency_histogram_buckets_are_cumulative() -> None:
    reg = registry_for(snapshot)
    bucket = "ragpulse_judge_latency_seconds_bucket"
    assert reg.get_sample_value(bucket, {"judge": "groundedness", "le": "0.0005"}) == 0
    assert reg.get_sample_value(bucket, {"judge": "groundedness", "le": "0.001"}) == 3
    assert reg.get_sample_value(bucket, {"judge": "groundedness", "le": "60.0"}) == 3
    assert reg.get_sample_value(bucket, {"judge": "groundedness", "le": "+Inf"}) == 4
    assert (
        reg.get_sample_value("ragpulse_judge_latency_seconds_count", {"judge": "groundedness"}) == 4
    )
    assert (
        reg.get_sample_value("ragpulse_judge_latency_seconds_sum", {"judge": "groundedness"})
        == 40.0
    )


def test_textfile_parses_as_prometheus_exposition(tmp_path: Path) -> None:
    path = tmp_path / "metrics.prom"
    write_textfile(path, snapshot())
    names = {f.name for f in text_string_to_metric_families(path.read_text())}
    assert {
        "ragpulse_events",
        "ragpulse_judge_pass_ratio",
        "ragpulse_consumer_lag",
        "ragpulse_heartbeat_timestamp_seconds",
        "ragpulse_judge_latency_seconds",
    } <= names


def test_every_rating_of_a_judged_series_is_exported_so_increase_sees_its_first_verdicts() -> None:
    reg = registry_for(snapshot)
    labels = {"judge": "groundedness", "app": "a", "model": "m"}
    assert reg.get_sample_value("ragpulse_judge_verdicts_total", {**labels, "rating": "no"}) == 0
    assert reg.get_sample_value("ragpulse_judge_verdicts_total", {**labels, "rating": "error"}) == 0
    app_model = {"app": "a", "model": "m"}
    assert reg.get_sample_value("ragpulse_events_without_context_total", app_model) == 0
    assert reg.get_sample_value("ragpulse_retrieved_chunks_total", app_model) == 0
