"""The image of deploy/Dockerfile, built by podman on a Debian bookworm base made with
debootstrap (`make image-base`: no registry image can be pulled here) and run: the ragpulse in
it serves from the test's Kafka broker (host network), judges what it reads, and answers
/healthz and /metrics; SIGTERM stops it cleanly (exit 0)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_broker import ApacheKafkaBroker
from podman import DEBIAN_BASE_IMAGE, build_image, podman, podman_command, podman_env
from serve_process import ServeProcess
from test_file_run import event

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(1800)]

TAG = "localhost/ragpulse:test"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> str:
    if podman("image", "exists", DEBIAN_BASE_IMAGE).returncode != 0:
        pytest.fail(f"podman has no image {DEBIAN_BASE_IMAGE}: run `make image-base` "
                    "(make test does it first)", pytrace=False)
    build_image(TAG, DEBIAN_BASE_IMAGE, tmp_path_factory.mktemp("image") / "build.log")
    return TAG


class ContainerServe(ServeProcess):
    """`ragpulse serve` inside the image, run in the foreground by `podman run` (signals are
    passed on to the container); the container is removed at `stop()` whatever happened."""

    own_temp_dir = False  # the container has its own /tmp

    def __init__(self, image: str, bootstrap: str, topic: str, *extra: str) -> None:
        super().__init__(bootstrap, topic, Path("/var/lib/ragpulse/state.sqlite"), extra,
                         env=podman_env())
        self.image = image
        self.name = f"ragpulse-test-{os.getpid()}-{self.port}"

    def command(self) -> list[str]:
        return podman_command(
            "run", "--rm", "--name", self.name, "--network", "host", self.image,
            *self.serve_args(),
        )  # fmt: skip

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            super().stop()
        podman("rm", "--force", "--ignore", self.name)


@pytest.fixture()
def container_serve() -> Iterator[list[ContainerServe]]:
    started: list[ContainerServe] = []
    yield started
    for serve in started:
        serve.stop()
        print(serve.log_text())


def test_the_image_runs_ragpulse_as_an_unprivileged_user(image: str) -> None:
    done = podman("run", "--rm", "--network", "host", "--entrypoint", "id", image, "-u")
    assert (done.returncode, done.stdout.strip()) == (0, "10001"), done.stderr
    done = podman("run", "--rm", "--network", "host", image, "serve", "--help")
    assert done.returncode == 0 and "--kafka-bootstrap" in done.stdout, done.stderr


def test_serve_in_the_container_judges_the_topic_and_answers_healthz_and_metrics(
    image: str, kafka_broker: ApacheKafkaBroker,
    container_serve: list[ContainerServe],
) -> None:
    topic = "chat-inference"
    kafka_broker.create_topic(topic)
    kafka_broker.produce(topic, [event(i, grounded=i % 4 != 0) for i in range(40)])
    serve = ContainerServe(image, kafka_broker.bootstrap, topic, "--window", "10s")
    container_serve.append(serve)
    serve.start(timeout=120)
    m = serve.wait_for(lambda m: m.total("ragpulse_events_total") >= 40, 120, "40 events read")
    assert m.value("ragpulse_events_total", outcome="accepted") == 40
    assert m.total("ragpulse_judge_verdicts_total", judge="groundedness") == 40
    failing = m.total("ragpulse_judge_verdicts_total", judge="groundedness", rating="no")
    assert failing == 10  # every fourth answer is ungrounded
    status, body = serve.healthz()
    assert status == 200, body
    assert serve.terminate() == 0
