"""A real Flink session cluster on loopback for `ragpulse stream`: a JobManager and TaskManagers
as separate JVMs, Beam's Flink job server submitting to it, the expansion service and a Python
worker pool, all from the jars `make stream-tools` resolves (.ci/tools/beam/pom.xml; there is no
`flink-dist` on Maven Central, but Flink's entrypoints are in the runner's flink-runtime jar).

    def test_x(flink_cluster: FlinkCluster) -> None:
        ragpulse("stream", ..., *flink_cluster.stream_args)
        tm = flink_cluster.taskmanager_running_tasks(job_id)
        flink_cluster.kill_taskmanager(tm)          # SIGKILL
        flink_cluster.start_taskmanagers(1)         # the replacement

What runs is what deploy/flink runs (`deployed_flink_configuration()`,
`deployed_job_server_args()`, `deployed_expansion_args()` read the manifests), with only the
differences that `LOCAL_FLINK_CONFIGURATION` and the docstrings below name: addresses, ports,
directories, memory sizes and heartbeat timing. tests/test_stream_deploy.py checks that nothing
else differs.

Processes, each in its own session and stopped by its id at the end:
- the JobManager (`StandaloneSessionClusterEntrypoint`), REST API on a free loopback port;
- TaskManagers (`TaskManagerRunner`), started and killed by the tests (`-D
  taskmanager.resource-id=tm-N` names each one in the REST API);
- Beam's Flink job server with `--flink-master=127.0.0.1:<REST port>`;
- Beam's expansion service and the Python worker pool (tests/flink_runner.py,
  tests/beam_services.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from beam_services import service, worker_pool_command
from flink_runner import (
    EXPANSION_SERVICE,
    FLINK_JOB_SERVER,
    JAVA_17_OPENS,
    LEAN_JVM,
    beam_classpath,
    java_command,
    kafka_read_jar,
)
from processes import free_port
from waiting import wait_until

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "flink"
JOB_MANAGER = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
TASK_MANAGER = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
WAIT_S = 600.0  # a JVM under load: deploying the job took 5 min on a 2-core machine at load 50
# The JobManager's and TaskManagers' JVMs are lean too (LEAN_JVM, tests/flink_runner.py).

# What differs from deploy/flink/flinkdeployment.yaml's flinkConfiguration here, and why: the
# directories (tmp_path, not a bucket), the addresses (loopback), the memory (a 2-core
# machine shared with the rest of the suite), the class loading order (below) and the
# heartbeat interval (a SIGKILLed TaskManager refuses two heartbeats, 1 s apart instead of
# 10 s, and is declared lost; a slow but live one still has Flink's 50 s: 4 s lost live
# TaskManagers on a loaded machine).
LOCAL_FLINK_CONFIGURATION: dict[str, str] = {
    # Beam's classes from the TaskManager's own classpath (the same jars as the job's): loaded
    # once per JVM, not again into a new child-first class loader for every submission and
    # restart, which took most of a job's 1-2 min in INITIALIZING here (a thread dump showed
    # its tasks in ChildFirstClassLoader.defineClass). deploy/flink's image has only the read
    # in lib/ and keeps Flink's child-first default.
    "classloader.resolve-order": "parent-first",
    "heartbeat.interval": "1000",
    "jobmanager.memory.process.size": "640m",
    "taskmanager.cpu.cores": "2",
    # A TaskManager started without Flink's scripts needs every memory size set.
    "taskmanager.memory.framework.heap.size": "96m",
    "taskmanager.memory.task.heap.size": "320m",
    "taskmanager.memory.framework.off-heap.size": "96m",
    "taskmanager.memory.task.off-heap.size": "32m",
    "taskmanager.memory.network.min": "32m",
    "taskmanager.memory.network.max": "32m",
    "taskmanager.memory.managed.size": "64m",
    "taskmanager.memory.jvm-metaspace.size": "256m",
    "taskmanager.memory.jvm-overhead.min": "96m",
    "taskmanager.memory.jvm-overhead.max": "96m",
}
# The keys whose value is a place (filled in per cluster by `FlinkCluster.configuration`).
PLACES = ("state.checkpoints.dir", "state.savepoints.dir")


def _documents(name: str) -> list[dict[str, Any]]:
    text = (DEPLOY / name).read_text(encoding="utf-8")
    return [d for d in yaml.safe_load_all(text) if d is not None]


def deployed_flink_configuration() -> dict[str, str]:
    """deploy/flink/flinkdeployment.yaml's flinkConfiguration: the cluster's settings."""
    (deployment,) = [d for d in _documents("flinkdeployment.yaml")
                     if d["kind"] == "FlinkDeployment"]
    return {str(k): str(v) for k, v in deployment["spec"]["flinkConfiguration"].items()}


def _container_args(manifest: str, deployment: str) -> list[str]:
    (found,) = [d for d in _documents(manifest)
                if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment]
    (container,) = found["spec"]["template"]["spec"]["containers"]
    return [str(a) for a in container["args"]]


def deployed_job_server_args() -> list[str]:
    """The job server's flags in deploy/flink/jobserver.yaml."""
    return _container_args("jobserver.yaml", "ragpulse-beam-jobserver")


def deployed_expansion_args() -> list[str]:
    """The expansion service's flags in deploy/flink/jobserver.yaml, after its port."""
    return _container_args("jobserver.yaml", "ragpulse-kafka-expansion")


def _flag_name(arg: str) -> str:
    return arg.partition("=")[0]


# The job server's flags whose values are addresses or directories; every other flag is run
# as deployed.
JOB_SERVER_PLACES = (
    "--flink-master", "--job-host", "--job-port", "--artifact-port", "--expansion-port",
    "--artifacts-dir",
)
# The expansion service's flags that choose the Java reader's environment and what it stages:
# deploy/flink runs it as a PROCESS (Beam's boot in the Flink image, which needs the service's
# jars staged); here it runs EMBEDDED in the TaskManager's JVM (no container image), on that
# JVM's classpath (`local_expansion_args`). Every other flag (experiments included) is run as
# deployed.
EXPANSION_ENVIRONMENT = ("--defaultEnvironmentType", "--defaultEnvironmentConfig", "--filesToStage")


def local_job_server_args(
    rest_port: int, job_port: int, artifact_port: int, artifacts_dir: Path
) -> list[str]:
    """The deployed job server flags, with this machine's addresses and directory."""
    places = {
        "--flink-master": f"127.0.0.1:{rest_port}",
        "--job-host": "127.0.0.1",
        "--job-port": str(job_port),
        "--artifact-port": str(artifact_port),
        "--expansion-port": str(free_port()),  # its own expansion service is not used
        "--artifacts-dir": str(artifacts_dir),
    }
    return [f"{_flag_name(a)}={places[_flag_name(a)]}" if _flag_name(a) in places else a
            for a in deployed_job_server_args()]


def local_expansion_args(port: int) -> list[str]:
    """The deployed expansion service's flags, its port first, with the EMBEDDED environment.

    An EMBEDDED reader runs on the classes of the Flink JVM it is in, whose classpath here is
    `beam_classpath()`: nothing needs staging but ragpulse's read. By default the service lists
    its whole classpath as the reader's files to stage (Beam's `TransformProvider.getDependencies`
    takes `--filesToStage` when it is set), and every submission then carried Beam's 190 jars
    (196 MB) from `ragpulse stream` to the job server and on to Flink's blob store, and Flink
    loaded them again in each job's class loader. Deployed, the PROCESS environment runs the
    reader in Beam's boot, which needs the service's jars staged: the flag is the tests' only."""
    kept = [a for a in deployed_expansion_args()[1:] if _flag_name(a) not in EXPANSION_ENVIRONMENT]
    return [str(port), *kept, "--defaultEnvironmentType=EMBEDDED",
            f"--filesToStage={kafka_read_jar()}"]


def _get_json(url: str, body: Mapping[str, Any] | None = None) -> Any:
    """GET (or POST `body`) and the JSON answer. A GET that times out is asked again, up to 3
    times: at load 60 the JobManager's REST API once took over 30 s to answer while it
    deployed a job, which failed the test in the middle of a wait (docs/figures.md, stop 36)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method="GET" if body is None else "POST",
        headers={"Content-Type": "application/json"},
    )
    attempts = 1 if body is not None else 3
    for attempt in range(attempts):
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read() or b"null")
        except TimeoutError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@dataclasses.dataclass
class FlinkCluster:
    """A running JobManager, its TaskManagers and Beam's services in front of it."""

    rest_port: int
    job_port: int
    artifact_port: int
    expansion_port: int
    pool_port: int
    root: Path
    taskmanagers: dict[str, subprocess.Popen[bytes]] = dataclasses.field(default_factory=dict)
    service_pids: list[int] = dataclasses.field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        """The process (and session) ids of every process of the cluster and its services."""
        return [*self.service_pids, *(p.pid for p in self.taskmanagers.values())]

    @property
    def config_dir(self) -> Path:
        return self.root / "conf"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def savepoint_dir(self) -> Path:
        return self.root / "savepoints"

    @property
    def stream_args(self) -> list[str]:
        """The `ragpulse stream` flags that submit to this cluster through the job server."""
        return [
            f"--expansion-service=127.0.0.1:{self.expansion_port}",
            "--runner=PortableRunner",
            f"--beam-arg=--job_endpoint=127.0.0.1:{self.job_port}",
            f"--beam-arg=--artifact_endpoint=127.0.0.1:{self.artifact_port}",
            "--beam-arg=--environment_type=EXTERNAL",
            f"--beam-arg=--environment_config=127.0.0.1:{self.pool_port}",
        ]

    def configuration(self) -> dict[str, str]:
        """The cluster's Flink configuration: the deployed one, with LOCAL_FLINK_CONFIGURATION
        and this cluster's addresses and directories."""
        config = {**deployed_flink_configuration(), **LOCAL_FLINK_CONFIGURATION}
        config.update({
            "state.checkpoints.dir": (self.root / "checkpoints").as_uri(),
            "state.savepoints.dir": self.savepoint_dir.as_uri(),
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": str(free_port()),
            "jobmanager.bind-host": "127.0.0.1",
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": str(self.rest_port),
            "blob.server.port": str(free_port()),
            "taskmanager.host": "127.0.0.1",
            "taskmanager.bind-host": "127.0.0.1",
            "io.tmp.dirs": str(self.root / "tmp"),
            "web.tmpdir": str(self.root / "web"),
        })
        return config

    def logs(self) -> str:
        return "\n".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-5000:]}"
            for log in sorted(self.log_dir.glob("*.log"))
        )

    # --- the REST API of the JobManager
    def rest(self, path: str, body: Mapping[str, Any] | None = None) -> Any:
        return _get_json(f"http://127.0.0.1:{self.rest_port}{path}", body)

    def running_job(self) -> str | None:
        """The id of the job in state RUNNING with all its tasks running, if there is one."""
        for job in self.rest("/jobs/overview")["jobs"]:
            if job["state"] == "RUNNING":
                tasks = job["tasks"]
                if tasks["running"] == tasks["total"]:
                    return str(job["jid"])
        return None

    def completed_checkpoints(self, job_id: str) -> int:
        return int(self.rest(f"/jobs/{job_id}/checkpoints")["counts"]["completed"])

    def restored_from(self, job_id: str) -> str | None:
        """The savepoint or checkpoint the job started from, if any (Flink's checkpoint
        statistics)."""
        restored = self.rest(f"/jobs/{job_id}/checkpoints")["latest"].get("restored")
        return None if not restored else str(restored["external_path"])

    def last_restart(self, job_id: str) -> int:
        """When the job last went RESTARTING (Flink's job timestamps, ms; 0 if never). Read
        instead of the numRestarts metric, which stayed 0 after a restart in one run."""
        return int(self.rest(f"/jobs/{job_id}")["timestamps"].get("RESTARTING", 0))

    def taskmanagers_running(self, job_id: str) -> set[str]:
        """The TaskManagers that run a subtask of the job now (each vertex's subtasks). A
        TaskManager's busy slots are not enough: after a restart the job keeps an idle slot
        allocated for a while, and killing its TaskManager then fails nothing."""
        return {
            str(subtask["taskmanager-id"])
            for vertex in self.rest(f"/jobs/{job_id}")["vertices"]
            for subtask in self.rest(f"/jobs/{job_id}/vertices/{vertex['id']}")["subtasks"]
            if subtask["status"] == "RUNNING"
        }

    def taskmanager_ids(self) -> set[str]:
        return {str(tm["id"]) for tm in self.rest("/taskmanagers")["taskmanagers"]}

    def taskmanager_running_tasks(self, job_id: str) -> str:
        """A TaskManager (of those the tests started, still alive) that runs a subtask of the
        job."""
        for name in sorted(self.taskmanagers_running(job_id)):
            started = self.taskmanagers.get(name)
            if started is not None and started.poll() is None:
                return name
        raise AssertionError("no TaskManager runs a task of the job")

    def cancel(self, job_id: str) -> None:
        """Cancels the job (no savepoint) and waits until Flink says it is cancelled."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.rest_port}/jobs/{job_id}?mode=cancel", method="PATCH"
        )
        urllib.request.urlopen(request, timeout=30).close()
        wait_until(lambda: self.rest(f"/jobs/{job_id}")["state"] == "CANCELED",
                   "the job's cancellation", WAIT_S, self.logs)

    def stop_with_savepoint(self, job_id: str) -> str:
        """Stops the job with a savepoint (Flink's stop, without draining: windows stay open
        in the savepoint); returns the savepoint's path."""
        trigger = self.rest(f"/jobs/{job_id}/stop", {
            "targetDirectory": self.savepoint_dir.as_uri(), "drain": False,
        })["request-id"]

        def done() -> Any:
            status = self.rest(f"/jobs/{job_id}/savepoints/{trigger}")
            return status if status["status"]["id"] == "COMPLETED" else None

        operation = wait_until(done, "the savepoint", WAIT_S, self.logs)["operation"]
        assert "location" in operation, operation
        return str(operation["location"])

    # --- TaskManagers
    def launch_taskmanagers(self, count: int = 1) -> list[str]:
        """Starts `count` more TaskManagers side by side and returns their resource ids at
        once (each registers with the JobManager when its JVM is up: `wait_registered`)."""
        names = []
        for _ in range(count):
            name = f"tm-{len(self.taskmanagers) + 1}"
            argv = ["java", "-Xmx416m", "-XX:MaxDirectMemorySize=192m", *LEAN_JVM,
                    *JAVA_17_OPENS, "-cp", beam_classpath(), TASK_MANAGER,
                    "--configDir", str(self.config_dir), "-D", f"taskmanager.resource-id={name}"]
            with (self.log_dir / f"taskmanager-{name}.log").open("wb") as out:
                self.taskmanagers[name] = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
                )
            names.append(name)
        return names

    def wait_registered(self, names: list[str]) -> None:
        def registered() -> bool:
            try:
                return set(names) <= self.taskmanager_ids()
            except urllib.error.HTTPError as error:
                # The JobManager's REST port opens before its dispatcher has a leader: until
                # then it answers 503 ("ongoing leader election"). Seen once, with the cluster
                # test started beside two other heavy modules (stop 38): the fixture failed 34 s
                # in, the JobManager still starting.
                if error.code == 503:
                    return False
                raise

        wait_until(registered, f"the registration of {', '.join(names)}", WAIT_S, self.logs)

    def start_taskmanagers(self, count: int = 1) -> list[str]:
        """Starts `count` more TaskManagers side by side; returns their resource ids once all
        have registered with the JobManager."""
        names = self.launch_taskmanagers(count)
        self.wait_registered(names)
        return names

    def kill_taskmanager(self, name: str) -> None:
        """SIGKILL to the TaskManager (its whole session): no shutdown, no last checkpoint."""
        process = self.taskmanagers[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)

    def stop_taskmanagers(self) -> None:
        for process in self.taskmanagers.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait(timeout=5)


@contextmanager
def flink_cluster_running(root: Path, taskmanagers: int = 2) -> Iterator[FlinkCluster]:
    """Starts the JobManager, `taskmanagers` TaskManagers, the job server, the expansion
    service and the worker pool on free loopback ports, with every file under `root`; stops
    them all (by process id) when the block ends."""
    cluster = FlinkCluster(free_port(), free_port(), free_port(), free_port(), free_port(), root)
    for folder in (cluster.config_dir, cluster.log_dir, root / "tmp", root / "artifacts"):
        folder.mkdir(parents=True, exist_ok=True)
    (cluster.config_dir / "config.yaml").write_text(
        yaml.safe_dump(cluster.configuration(), sort_keys=True), encoding="utf-8"
    )
    services: list[AbstractContextManager[int]] = [
        service("jobmanager",
                ["java", "-Xmx384m", *LEAN_JVM, *JAVA_17_OPENS, "-cp", beam_classpath(),
                 JOB_MANAGER, "--configDir", str(cluster.config_dir)],
                cluster.rest_port, cluster.log_dir),
        service("expansion-service",
                java_command(EXPANSION_SERVICE, *local_expansion_args(cluster.expansion_port)),
                cluster.expansion_port, cluster.log_dir),
        service("flink-job-server",
                java_command(FLINK_JOB_SERVER, *local_job_server_args(
                    cluster.rest_port, cluster.job_port, cluster.artifact_port,
                    root / "artifacts")),
                cluster.job_port, cluster.log_dir),
        service("worker-pool", worker_pool_command(cluster.pool_port), cluster.pool_port,
                cluster.log_dir),
    ]
    with ExitStack() as stack:
        stack.callback(cluster.stop_taskmanagers)
        # Every JVM starts at once: the TaskManagers retry their registration until the
        # JobManager is up, and the job server reaches the JobManager only when a job comes.
        names = cluster.launch_taskmanagers(taskmanagers)
        with ThreadPoolExecutor(len(services)) as starting:
            started = [starting.submit(stack.enter_context, s) for s in services]
        cluster.service_pids.extend(pid.result() for pid in started)
        cluster.wait_registered(names)
        yield cluster


@pytest.fixture(scope="module")
def flink_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlinkCluster]:
    """Fixture `flink_cluster`: a JobManager, two TaskManagers and Beam's services for a
    module; their logs are printed at teardown (pytest shows them when a test failed)."""
    root = tmp_path_factory.mktemp("flink-cluster")
    cluster: FlinkCluster | None = None
    try:
        with flink_cluster_running(root) as cluster:
            yield cluster
    finally:
        if cluster is not None:
            print(cluster.logs())
