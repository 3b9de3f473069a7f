"""`--runner`: ragpulse on Beam's portable runner, the path Flink, Spark and Dataflow take.

`ragpulse run` and a `ragpulse serve` cycle are sent to Beam's own job service, whose SDK
workers come from an external worker pool (tests/beam_services.py), all on loopback; what they
produce must be what the default runner (FnApiRunner in the process) produces. The runner only
reports Beam metrics back to the process that submitted the job, and the Kafka sinks publish
from the worker processes, so these runs exercise both.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.portability.api import beam_job_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.portability.fn_api_runner.fn_runner import RunnerResult
from apache_beam.runners.portability.portable_runner import PortableMetrics
from beam_services import PortableBeam, beam_portable  # noqa: F401
from graph_runs import stage_config
from kafka_broker import ApacheKafkaBroker, free_port, kafka_broker  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families
from serve_process import Scrape, ServeProcess, read_topic, serve_processes_fixture  # noqa: F401
from test_serve import durable_counters

from ragpulse.pipeline.cli import main
from ragpulse.pipeline.commands.simulate import Incidents, simulate
from ragpulse.pipeline.graphs.bounded import Sinks, build_graph, decode_metrics
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.sinks.files import WriteDeadLetters

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples" / "events.jsonl"
T0 = 1_763_632_800.0  # 2025-11-20T10:00:00Z, a multiple of the 10 s windows used here
PORTABLE = ["--runner", "PortableRunner"]


def ragpulse(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("ragpulse")
    prog = [str(script)] if script.is_file() else [sys.executable, "-m", "ragpulse.pipeline.cli"]
    done = subprocess.run([*prog, *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def counters_of(textfile: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a metrics textfile but the judge latency timings."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(textfile.read_text())
        if family.name != "ragpulse_judge_latency_seconds"
        for s in family.samples
    }


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_run_on_the_portable_runner_writes_the_same_rows_and_counters_as_the_default_runner(
    beam_portable: PortableBeam,  # noqa: F811
    tmp_path: Path,
) -> None:
    ragpulse("run", str(SAMPLES), "--output", str(tmp_path / "default"))
    ragpulse(
        "run", str(SAMPLES), "--output", str(tmp_path / "portable"),
        *PORTABLE, *beam_portable.beam_args,
    )  # fmt: skip

    for rows in ("verdicts.jsonl", "windows.jsonl", "dead_letter.jsonl"):
        want = sorted((tmp_path / "default" / rows).read_text().splitlines())
        assert sorted((tmp_path / "portable" / rows).read_text().splitlines()) == want, rows
    want_counters = counters_of(tmp_path / "default" / "metrics.prom")
    assert counters_of(tmp_path / "portable" / "metrics.prom") == want_counters
    assert want_counters[("ragpulse_events_total", (("outcome", "accepted"),))] > 500
    assert want_counters[("ragpulse_dead_letters_total", ())] > 0


@pytest.mark.timeout(240)
def test_a_serve_cycle_on_the_portable_runner_counts_and_publishes_what_the_default_runner_does(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: Callable[..., ServeProcess],
    beam_portable: PortableBeam,  # noqa: F811
    tmp_path: Path,
) -> None:
    incidents = Incidents(malformed_burst_at=5.0, malformed_burst_count=20)
    payloads = [e.payload for e in simulate(11, 200, T0, rate=10, incidents=incidents)]
    runners = {"default": [], "portable": [*PORTABLE, *beam_portable.beam_args]}
    serves = {}
    for name, args in runners.items():  # each on its own topics, with the same records
        kafka_broker.create_topic(name, 2)
        kafka_broker.produce(name, payloads[::2], partition=0)
        kafka_broker.produce(name, payloads[1::2], partition=1)
        serves[name] = serve_processes(
            kafka_broker.bootstrap, name, tmp_path / f"{name}.sqlite",
            ["--window", "10s", "--publish-verdicts", "all", *args],
        ).start()  # fmt: skip

    def caught_up(m: Scrape) -> bool:
        return m.total("ragpulse_events_total") >= 200

    scrapes = {
        name: s.wait_for(caught_up, 150, "all 200 records read") for name, s in serves.items()
    }

    def counters(name: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """serve's durable counters, with its topic names (in `topic` labels) made alike."""
        return {
            (metric, tuple((k, v.replace(name, "TOPIC")) for k, v in labels)): value
            for (metric, labels), value in durable_counters(scrapes[name]).items()
        }

    assert counters("portable") == counters("default")
    assert scrapes["default"].value("ragpulse_dead_letters_total") == 20
    # One cycle read every record (idle cycles that read nothing are not timed).
    assert scrapes["portable"].value("ragpulse_cycle_duration_seconds_count") == 1
    assert serves["portable"].windows() == serves["default"].windows()

    def published(topic: str, expected: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        records = read_topic(kafka_broker.bootstrap, topic, expected)
        return sorted((r.value, sorted(r.headers)) for r in records)

    assert published("portable.dlq", 20) == published("default.dlq", 20)
    assert len(published("portable.verdicts", 180)) == 180
    assert published("portable.verdicts", 180) == published("default.verdicts", 180)
    for serve in serves.values():
        assert serve.terminate() == 0


def test_metrics_a_runner_reports_only_as_attempted_decode_as_committed_ones_do(
    tmp_path: Path,
) -> None:
    """Flink's and Spark's job servers report attempted metrics only (no committed values):
    the same monitoring infos, reported either way, give the same result."""
    lines = SAMPLES.read_bytes().splitlines()[:200]
    records = [SourceRecord(line, "events", i % 2, i) for i, line in enumerate(lines)]
    with beam.Pipeline(runner=FnApiRunner()) as p:
        build_graph(
            p,
            beam.Create(records),
            stage_config(),
            Sinks(WriteDeadLetters(tmp_path), exemplars=True),
        )
    assert isinstance(p.result, RunnerResult)
    infos = list(p.result.monitoring_infos())

    def reported(results: beam_job_api_pb2.MetricResults) -> PortableMetrics:
        return PortableMetrics(beam_job_api_pb2.GetJobMetricsResponse(metrics=results))

    committed = decode_metrics(reported(beam_job_api_pb2.MetricResults(committed=infos)))
    attempted = decode_metrics(reported(beam_job_api_pb2.MetricResults(attempted=infos)))
    assert attempted == committed
    assert committed.windows and committed.latest_event_time and committed.exemplars


@pytest.mark.parametrize(
    ("runner", "says"),
    [
        # An unknown name may be anything (a secret under the wrong key): not shown.
            ("Flunk", "unknown Beam runner (value not shown); choose one of FnApiRunner"),
        ("DirectRunner", "ragpulse does not run on DirectRunner: it first tries Prism, downloaded"),
        ("prism", "ragpulse does not run on PrismRunner: it downloads the Prism binary"),
        (
            "apache_beam.runners.dask.dask_runner.DaskRunner",
            "ragpulse does not run on DaskRunner: it drops windows",
        ),
    ],
)
def test_a_runner_ragpulse_cannot_use_is_refused_with_one_line_naming_the_reason(
    runner: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", str(SAMPLES), "--runner", runner]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"ragpulse run: invalid settings: --runner: {says}")
    assert "Traceback" not in err


def test_the_runner_given_as_a_beam_option_is_refused_so_that_it_is_checked_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["run", str(SAMPLES), "--beam-arg=--runner=DirectRunner"]) == 2
    assert "--beam-arg: choose the runner with --runner NAME" in capsys.readouterr().err


def test_a_job_service_that_does_not_answer_is_named_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    endpoint = f"127.0.0.1:{free_port()}"  # nothing listens there
    args = [f"--beam-arg=--job_endpoint={endpoint}", "--beam-arg=--job_server_timeout=1"]
    assert main(["run", str(SAMPLES), "--runner", "PortableRunner", *args]) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"ragpulse run: the Beam job service at {endpoint} did not answer within 1s "
        "(--beam-arg=--job_endpoint, --beam-arg=--job_server_timeout)"
    )
    assert "Traceback" not in err
