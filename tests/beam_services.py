"""Beam's own job service and an external SDK worker pool on loopback: the portable runner path
(the one Flink's, Spark's and Dataflow's runners take), without a cluster.

    def test_x(beam_portable: PortableBeam) -> None:
        run(["ragpulse", "run", ..., "--runner", "PortableRunner", *beam_portable.beam_args])

The job service is `python -m apache_beam.runners.portability.local_job_service_main`, which
binds `localhost`. Beam's `worker_pool_main` binds every interface, so the worker pool is
started by this module's `__main__` on 127.0.0.1 instead; it starts each SDK worker as a
`python` process found on PATH, so the pool's PATH puts this interpreter's directory first
(the workers then import this checkout through the inherited PYTHONPATH). Both run in their
own sessions, so stopping them takes down the workers they started.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest
from processes import free_port

START_TIMEOUT_S = 120.0  # a JVM service (Flink's job server) on a loaded 2-core machine


@dataclasses.dataclass(frozen=True)
class PortableBeam:
    """The addresses of a running job service and worker pool, as Beam options."""

    job_port: int
    pool_port: int

    @property
    def beam_args(self) -> list[str]:
        """The `--beam-arg` values that send a run to them (with `--runner PortableRunner`)."""
        return [
            f"--beam-arg=--job_endpoint=127.0.0.1:{self.job_port}",
            "--beam-arg=--environment_type=EXTERNAL",
            f"--beam-arg=--environment_config=127.0.0.1:{self.pool_port}",
        ]


def worker_pool_command(port: int) -> list[str]:
    """The command that runs this module's worker pool on 127.0.0.1:`port`."""
    return [sys.executable, str(Path(__file__).resolve()), str(port)]


def _wait_for_port(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}:\n{log.read_text()}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"port {port} did not open within {START_TIMEOUT_S}s:\n{log.read_text()}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process's session (its children too), SIGKILL if it lingers."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


@contextmanager
def service(
    name: str, argv: Sequence[str], port: int, log_dir: Path, python: Path | None = None
) -> Iterator[int]:
    """Runs `argv` in its own session, output to log_dir/NAME.log, until the block ends, once
    `port` accepts on loopback; yields its process id. PATH puts the directory of `python`
    (by default this interpreter) first, for the `python` processes a worker pool starts."""
    bin_dir = (python or Path(sys.executable)).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            list(argv), stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        _wait_for_port(process, port, log)
        yield process.pid
    finally:
        _stop(process)


@pytest.fixture(scope="module")
def beam_portable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PortableBeam]:
    """A job service and a worker pool on free ports of loopback, stopped after the module."""
    logs = tmp_path_factory.mktemp("beam-services")
    services = PortableBeam(free_port(), free_port())
    job_service = [
        sys.executable,
        "-m",
        "apache_beam.runners.portability.local_job_service_main",
        "--port",
        str(services.job_port),
    ]
    try:
        with ExitStack() as stack:
            stack.enter_context(service("job-service", job_service, services.job_port, logs))
            stack.enter_context(
                service(
                    "worker-pool",
                    worker_pool_command(services.pool_port),
                    services.pool_port,
                    logs,
                )
            )
            yield services
    finally:
        for log in sorted(logs.iterdir()):  # shown by pytest when a test failed
            print(f"--- {log.name}\n{log.read_text()[-4000:]}")


def _serve_worker_pool(port: int) -> None:
    """Beam's external worker pool (SDK workers as processes) on 127.0.0.1:`port`, until killed."""
    from concurrent import futures

    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker.worker_pool_main import BeamFnExternalWorkerPoolServicer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
        BeamFnExternalWorkerPoolServicer(use_process=True), server
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


if __name__ == "__main__":
    _serve_worker_pool(int(sys.argv[1]))
