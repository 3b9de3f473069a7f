"""`ragpulse stream` on Beam's Prism runner, built from the Go module proxy by `make
stream-tools` (github.com/apache/beam/sdks/v2/go/cmd/prism at the pinned Beam version).

Prism runs as a job server (`prism --job_port=PORT`) and `ragpulse stream` submits to it with
`--runner PortableRunner`, the Kafka reader expanded by the same expansion service as on Flink.
Prism 2.62.0 refused the stream's windowing strategy when the job was prepared: it implemented
neither allowed lateness, nor accumulating panes, nor early/late triggers; Prism 2.70.0 accepts
the job. The test submits the real job every time and is skipped with Prism's own message only
when Prism still refuses exactly that; any other outcome fails it, so a change in what Prism
accepts is noticed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import apache_beam
import pytest
from beam_services import service
from cli import ragpulse
from flink_runner import EXPANSION_SERVICE, beam_tools_dir, java_command
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from processes import free_port
from test_stream_flink import create_topics, produce_events

from ragpulse.pipeline.commands.simulate import simulate

pytestmark = [pytest.mark.slow, pytest.mark.prism, pytest.mark.timeout(900)]

UNIMPLEMENTED = re.compile(r'unsupported feature "WindowingStrategy\.[A-Za-z]+"[^\n]*')


def prism_binary() -> Path:
    prism = beam_tools_dir() / "bin" / "prism"
    if not prism.is_file():
        pytest.fail(f"no Prism at {prism}: run `make stream-tools`", pytrace=False)
    return prism


def test_stream_on_prism_runs_or_prism_still_refuses_its_windowing(
    kafka_broker: ApacheKafkaBroker, tmp_path: Path  # noqa: F811
) -> None:
    topic = "inference-logs"
    create_topics(kafka_broker.bootstrap, topic, f"{topic}.ratings", f"{topic}.dlq")
    produce_events(kafka_broker.bootstrap, topic, list(simulate(7, 10, time.time() - 3600)))
    job_port, expansion_port = free_port(), free_port()
    prism = [str(prism_binary()), f"--job_port={job_port}", "--serve_http=false"]
    # Without deploy/flink's --experiments=use_deprecated_read: Prism 2.70.0 refuses the legacy
    # read's primitive (`unsupported feature "PTransform.Spec.Urn" set with value
    # beam:transform:read:v1`), so here ragpulse's read expands to KafkaIO's splittable DoFn,
    # with the same timestamp policy.
    expansion = java_command(
        EXPANSION_SERVICE, str(expansion_port), "--defaultEnvironmentType=EMBEDDED"
    )
    with service("prism", prism, job_port, tmp_path), service(
        "expansion-service", expansion, expansion_port, tmp_path
    ):
        done = ragpulse(
            "stream",
            f"--kafka-bootstrap={kafka_broker.bootstrap}",
            f"--topic={topic}",
            "--judge-backend=local",
            f"--expansion-service=127.0.0.1:{expansion_port}",
            "--runner=PortableRunner",
            f"--beam-arg=--job_endpoint=127.0.0.1:{job_port}",
            "--beam-arg=--environment_type=LOOPBACK",
            timeout=600,
        )
    refused = UNIMPLEMENTED.findall(done.stderr)
    if done.returncode != 0 and refused:
        version = apache_beam.__version__
        pytest.skip(
            f"Prism {version} (go install github.com/apache/beam/sdks/v2/go/cmd/prism@v{version}) "
            "refuses the stream's job at Prepare: " + "; ".join(refused)
        )
    assert done.returncode == 0, done.stderr[-4000:]
