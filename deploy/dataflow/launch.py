"""Entry point of the Dataflow flex template launcher (FLEX_TEMPLATE_PYTHON_PY_FILE).

The launcher runs `python launch.py --NAME=VALUE ...` with the template's parameters (names of
deploy/dataflow/metadata.json, where `_` stands for `-`: kafka_bootstrap is --kafka-bootstrap)
mixed with Dataflow's own pipeline options (--project, --region, --temp_location,
--sdk_container_image, ...). This hands the first to `ragpulse stream` as its flags and the
rest as --beam-arg, with --runner DataflowRunner, and returns once the job is submitted.

The stream's Kafka read is ragpulse's (java/kafka-read): the launcher starts Beam's expansion
service with that jar on its classpath (both in this image, deploy/dataflow/Dockerfile) on a
free loopback port, passes it as --expansion-service, and stops it once the job is submitted.
The service's default environment is Beam's Java SDK container, and it stages the jars of its
classpath (ragpulse's read with them) for Dataflow's Java workers: the workers run the same read.
Without `--experiments=use_deprecated_read` (which deploy/flink gives its service): Dataflow
Runner v2 runs KafkaIO's splittable read, with the same timestamp policy.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ragpulse.pipeline import cli

# Where deploy/dataflow/Dockerfile puts the jars (tests/test_stream_deploy.py runs the service
# on the jars the tests build instead).
EXPANSION_CLASSPATH = "/opt/beam/expansion-service.jar:/opt/beam/ragpulse-kafka-read.jar"
EXPANSION_SERVICE = "org.apache.beam.sdk.expansion.service.ExpansionService"
# The service's flags after its port: Java classes the read names may be looked up; the
# environment is the default one (DOCKER: Beam's Java SDK image, with the staged jars).
EXPANSION_ARGS = ("--javaClassLookupAllowlistFile=*",)
EXPANSION_START_S = 120.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def expansion_service(classpath: str = EXPANSION_CLASSPATH) -> Iterator[str]:
    """Beam's expansion service with ragpulse's Kafka read, on a free loopback port, until the
    block ends; yields its host:port. Its output goes to the launcher's (Dataflow shows it in
    the launch's log). Fails if it exits or does not listen within EXPANSION_START_S."""
    port = _free_port()
    process = subprocess.Popen(
        ["java", "-cp", classpath, EXPANSION_SERVICE, str(port), *EXPANSION_ARGS],
        stdout=sys.stderr,
    )
    try:
        deadline = time.monotonic() + EXPANSION_START_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"the expansion service exited ({process.returncode}); its output is above"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the expansion service did not listen on {port} "
                        f"within {EXPANSION_START_S:.0f} s"
                    ) from None
                time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stream_flags() -> set[str]:
    """The long flags `ragpulse stream` takes (e.g. --kafka-bootstrap)."""
    parser = cli.build_parser()
    sub = cli._subparser(parser, "stream")
    return {flag for action in sub._actions for flag in action.option_strings}


def ragpulse_argv(launcher_argv: list[str]) -> list[str]:
    """`ragpulse stream` arguments from the launcher's (every one given as --NAME=VALUE)."""
    flags = stream_flags()
    own: list[str] = []
    beam: list[str] = []
    for arg in launcher_argv:
        name, sep, value = arg.partition("=")
        flag = name.replace("_", "-")
        if flag in flags:
            own.append(f"{flag}={value}" if sep else flag)
        else:
            beam.append(f"--beam-arg={arg}")
    if not any(a.startswith("--runner=") for a in own):
        own.append("--runner=DataflowRunner")
    return ["stream", *own, *beam]


def main(launcher_argv: list[str]) -> int:
    argv = ragpulse_argv(launcher_argv)
    if any(a.startswith("--expansion-service=") for a in argv):
        return cli.main(argv)  # an expansion service of the user's
    with expansion_service() as address:
        return cli.main([*argv, f"--expansion-service={address}"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
