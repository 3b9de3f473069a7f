"""The deployment files of `ragpulse stream` (deploy/dataflow, deploy/flink) are consistent.

None of them can be built or applied here (no Docker daemon, no cluster, no GCP): these tests
check what can be checked offline. Every file parses; the Kubernetes objects of the built-in
kinds are valid against the Kubernetes schemas; every file a Dockerfile copies and every image
the manifests name is built from this repository; every Beam image, jar and job server has the
Beam version pyproject.toml pins; and every `ragpulse` command line in them (the Kubernetes
containers, and the Dataflow template's parameters through its launcher) is accepted by the
real command and its settings.
"""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import apache_beam
import flink_cluster
import flink_runner
import pytest
import yaml
from flink_cluster import FlinkCluster
from test_stream_flink_cluster import stream_argv as cluster_stream_argv

from ragpulse.pipeline import cli
from ragpulse.pipeline.settings.command_flags import STREAM, settings_from

REPO = Path(__file__).resolve().parent.parent
DATAFLOW = REPO / "deploy" / "dataflow"
FLINK = REPO / "deploy" / "flink"
DOCKERFILES = [
    DATAFLOW / "Dockerfile",
    FLINK / "flink.Dockerfile",
    FLINK / "expansion-service.Dockerfile",
    FLINK / "jobserver.Dockerfile",
    REPO / "deploy" / "beam-sdk.Dockerfile",
]
# The images the manifests name, and the Dockerfile in this repository that builds each.
OUR_IMAGES = {
    "REGISTRY/ragpulse:TAG": REPO / "deploy" / "Dockerfile",
    "REGISTRY/ragpulse-beam-sdk:TAG": REPO / "deploy" / "beam-sdk.Dockerfile",
    "REGISTRY/ragpulse-flink:1.19-beam2.70.0": FLINK / "flink.Dockerfile",
    "REGISTRY/ragpulse-kafka-expansion:2.70.0": FLINK / "expansion-service.Dockerfile",
    "REGISTRY/ragpulse-flink-jobserver:2.70.0": FLINK / "jobserver.Dockerfile",
}


def beam_pin() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    pins = [d for d in project["dependencies"] if d.startswith("apache-beam==")]
    assert len(pins) == 1
    return pins[0].removeprefix("apache-beam==")


def flink_objects() -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(FLINK.glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8"))
        if doc is not None
    ]


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]
    if obj["kind"] == "FlinkDeployment":
        return list(spec["taskManager"]["podTemplate"]["spec"]["containers"])
    if "template" in spec:
        return list(spec["template"]["spec"]["containers"])
    return []


def launcher() -> ModuleType:
    loaded = importlib.util.spec_from_file_location("launch", DATAFLOW / "launch.py")
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def test_the_installed_beam_is_the_one_pyproject_pins() -> None:
    assert apache_beam.__version__ == beam_pin()


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_copy_files_of_this_repository_and_use_the_pinned_beam(
    dockerfile: Path,
) -> None:
    text = dockerfile.read_text(encoding="utf-8")
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.MULTILINE):
        *sources, _ = line.split()
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile.name} copies {source}: not found"
    versions = re.findall(r"beam[-_a-z0-9.]*[:/-](\d+\.\d+\.\d+)", text)
    assert versions, f"{dockerfile.name} names no Beam image or jar"
    assert set(versions) == {beam_pin()}, f"{dockerfile.name} names Beam {versions}"
    bases = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert bases and all(b != "ragpulse" or (REPO / "deploy" / "Dockerfile").is_file()
                         for b in bases)


def test_the_flex_template_metadata_is_a_streaming_template_of_the_stream_flags() -> None:
    metadata = json.loads((DATAFLOW / "metadata.json").read_text(encoding="utf-8"))
    assert metadata["streaming"] is True
    names = [p["name"] for p in metadata["parameters"]]
    assert len(names) == len(set(names))
    # Every parameter is a flag of `ragpulse stream` (launch.py reads `_` as `-`), so none
    # silently becomes a Beam option; the required ones are exactly the command's.
    flags = launcher().stream_flags()
    assert {"--" + n.replace("_", "-") for n in names} <= flags
    required = {"--" + p["name"].replace("_", "-") for p in metadata["parameters"]
                if not p.get("isOptional")}
    parser = cli._subparser(cli.build_parser(), "stream")
    assert required == {a.option_strings[0] for a in parser._actions if a.required} - {"--runner"}
    for p in metadata["parameters"]:
        for regex in p.get("regexes", []):
            re.compile(regex)


def test_the_flex_template_launcher_turns_parameters_into_valid_stream_settings() -> None:
    argv = launcher().ragpulse_argv([
        "--kafka_bootstrap=kafka-0.internal:9092",
        "--topic=inference-logs",
        "--window=5m",
        "--allowed_lateness=10m",
        "--early_firing=60s",
        "--sample_rate=0.2",
        "--judge_backend=local",
        "--project=p",
        "--region=europe-west1",
        "--temp_location=gs://b/tmp",
        "--sdk_container_image=europe-west1-docker.pkg.dev/p/ragpulse/ragpulse-beam-sdk:0.1.0",
    ])
    args = cli.build_parser().parse_args(argv)
    assert args.runner == "DataflowRunner"
    assert args.beam_arg == [
        "--project=p",
        "--region=europe-west1",
        "--temp_location=gs://b/tmp",
        "--sdk_container_image=europe-west1-docker.pkg.dev/p/ragpulse/ragpulse-beam-sdk:0.1.0",
    ]
    if importlib.util.find_spec("apitools") is None:
        # The launcher image installs apache-beam[gcp]; here only its absence can be refused.
        with pytest.raises(Exception, match="needs apache-beam\\[gcp\\]"):
            settings_from(STREAM, args)
        return
    settings = settings_from(STREAM, args)
    assert (settings.window_seconds, settings.allowed_lateness_seconds) == (300, 600)


def test_flink_manifests_parse_and_the_built_in_kinds_are_valid_kubernetes_objects() -> None:
    import kubernetes_validate

    objects = flink_objects()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["FlinkDeployment", "PersistentVolumeClaim", "Deployment", "Service",
                            "Deployment", "Service", "Job", "Deployment", "Service"])
    for obj in objects:
        if obj["apiVersion"] == "flink.apache.org/v1beta1":
            continue  # a CRD: kubernetes-validate ships the built-in kinds only
        kubernetes_validate.validate(obj, "1.30.0", strict=True)


def test_the_flink_deployment_matches_the_job_server_and_runs_the_python_worker_pool() -> None:
    objects = flink_objects()
    (flink,) = [o for o in objects if o["kind"] == "FlinkDeployment"]
    minor = flink["spec"]["flinkVersion"].removeprefix("v").replace("_", ".")
    images = [c["image"] for o in objects for c in containers(o) if "image" in c]
    assert "REGISTRY/ragpulse-flink-jobserver:2.70.0" in images
    assert f"FROM apache/beam_flink{minor}_job_server:{beam_pin()}" in (
        FLINK / "jobserver.Dockerfile").read_text(encoding="utf-8")
    assert f"flink:{minor}-java11" in (FLINK / "flink.Dockerfile").read_text(encoding="utf-8")
    (pool,) = [c for c in containers(flink) if c.get("args") == ["--worker_pool"]]
    assert pool["image"] == "REGISTRY/ragpulse-beam-sdk:TAG"
    assert pool["ports"][0]["containerPort"] == 50000
    for image in images:
        if image.startswith("REGISTRY/"):
            assert image in OUR_IMAGES, f"{image} is built by no Dockerfile of this repository"
            assert OUR_IMAGES[image].is_file()
    assert flink["spec"]["image"] in OUR_IMAGES


def test_every_ragpulse_command_in_the_flink_manifests_gives_valid_settings() -> None:
    commands = [
        c["args"] for o in flink_objects() for c in containers(o)
        if c.get("image") == "REGISTRY/ragpulse:TAG"
    ]
    assert sorted(args[0] for args in commands) == ["exporter", "stream"]
    for args in commands:
        parsed = cli.build_parser().parse_args(args)
        settings = settings_from(cli.COMMANDS[args[0]].flags, parsed)
        if args[0] == "stream":
            # The Python stages run in the sidecar the FlinkDeployment starts on port 50000.
            assert "--environment_config=localhost:50000" in settings.beam_args
            assert settings.runner == "PortableRunner"
def submit_job_args() -> list[str]:
    job = yaml.safe_load((REPO / "deploy" / "flink" / "submit-job.yaml").read_text("utf-8"))
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return list(container["args"])


def flag_names(argv: Sequence[str]) -> list[str]:
    """Each flag's name; for --beam-arg, the Beam option's name, and for the options whose
    value is not an address or a size (the environment type), the value too."""
    names = []
    for arg in argv[1:]:
        flag, _, value = arg.partition("=")
        if flag == "--beam-arg":
            option, _, option_value = value.partition("=")
            names.append(f"{flag}={option}" + (
                f"={option_value}" if option == "--environment_type" else ""))
        elif flag == "--kafka-consumer-config":
            names.append(f"{flag}={value.partition('=')[0]}")
        else:
            names.append(flag)
    return names


# The test judges offline; the deployment's judges are its own choice (its config file).
NOT_IN_DEPLOYMENT = {"--judges", "--judge-backend"}


def a_cluster() -> FlinkCluster:
    return FlinkCluster(8081, 8099, 8098, 8097, 50000, Path("/nonexistent"))


def test_the_flink_deployment_submits_the_flags_the_cluster_test_runs() -> None:
    tested = [f for f in flag_names(cluster_stream_argv("k:9092", "t", a_cluster()))
              if f not in NOT_IN_DEPLOYMENT]
    deployed = submit_job_args()
    assert deployed[0] == "stream"
    assert flag_names(deployed) == tested


# What the cluster test may change in the deployed Flink configuration: where things are,
# how much memory a JVM gets, how fast a lost TaskManager is noticed, and where Beam's classes
# load from (the test's TaskManagers have them on their classpath; the image does not).
LOCAL_KINDS = ("jobmanager.memory.", "taskmanager.memory.", "taskmanager.cpu.", "heartbeat.",
               "classloader.")


def test_the_cluster_test_runs_the_deployed_flink_configuration() -> None:
    deployed = flink_cluster.deployed_flink_configuration()
    local = a_cluster().configuration()
    assert all(k.startswith(LOCAL_KINDS) for k in flink_cluster.LOCAL_FLINK_CONFIGURATION)
    changed = {k for k, v in deployed.items() if local[k] != v}
    assert changed == set(flink_cluster.PLACES)
    assert "restart-strategy.type" in deployed and "state.backend.type" in deployed


def test_the_cluster_test_runs_the_deployed_job_server_and_expansion_service_flags() -> None:
    def names_and_values(args: list[str], places: tuple[str, ...]) -> list[str]:
        return [a.partition("=")[0] if a.partition("=")[0] in places else a for a in args]

    places = flink_cluster.JOB_SERVER_PLACES
    local = flink_cluster.local_job_server_args(8081, 8099, 8098, Path("/artifacts"))
    assert names_and_values(local, places) == names_and_values(
        flink_cluster.deployed_job_server_args(), places)
    environment = flink_cluster.EXPANSION_ENVIRONMENT

    def without_environment(args: list[str]) -> list[str]:
        return [a for a in args if a.partition("=")[0] not in environment]

    local_expansion = flink_cluster.local_expansion_args(8097)
    deployed_expansion = flink_cluster.deployed_expansion_args()
    assert local_expansion[0] == deployed_expansion[0] == "8097"
    assert without_environment(local_expansion) == without_environment(deployed_expansion)
    assert "--defaultEnvironmentType=EMBEDDED" in local_expansion
    assert f"--filesToStage={flink_runner.kafka_read_jar()}" in local_expansion
    assert not any(a.startswith("--filesToStage") for a in deployed_expansion)


def test_the_deployed_images_load_the_kafka_read_the_tests_build() -> None:
    """ragpulse's Kafka read (java/kafka-read) is built from this repository's sources by both
    images, as `make kafka-read-jar` builds it for the tests: on the expansion service's
    classpath (its registrar offers the read) and in Flink's lib/ (the legacy read runs in the
    TaskManager's JVM), as tests/flink_runner.py puts it on every Java process's classpath."""
    expansion = (FLINK / "expansion-service.Dockerfile").read_text(encoding="utf-8")
    flink = (FLINK / "flink.Dockerfile").read_text(encoding="utf-8")
    for dockerfile in (expansion, flink):
        assert "COPY java/kafka-read /src" in dockerfile
        assert "mvn -q -B -f /src/pom.xml package" in dockerfile
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", expansion, re.MULTILINE)
    command = json.loads(entrypoint)
    assert command[:2] == ["java", "-cp"]
    assert "/opt/beam/ragpulse-kafka-read.jar" in command[2].split(":")
    assert command[3] == flink_runner.EXPANSION_SERVICE
    assert "/opt/flink/lib/ragpulse-kafka-read.jar" in flink
    assert "--experiments=use_deprecated_read" in flink_cluster.deployed_expansion_args()


def test_the_deployed_job_server_loads_ragpulses_flink_source_before_beams() -> None:
    """The job server's classpath has ragpulse's read ahead of Beam's job server jar, as
    tests/flink_runner.py puts it ahead of Beam's jars: the job is built with, and the
    TaskManagers' child-first class loaders load from the job's jars in that order, ragpulse's
    copy of Beam's Flink source wrapper (no final watermark on a stop with savepoint)."""
    jobserver = (FLINK / "jobserver.Dockerfile").read_text(encoding="utf-8")
    assert "COPY java/kafka-read /src" in jobserver
    assert "mvn -q -B -f /src/pom.xml package" in jobserver
    (entrypoint,) = re.findall(r"^ENTRYPOINT (.+)$", jobserver, re.MULTILINE)
    command = json.loads(entrypoint)
    assert command[:2] == ["java", "-cp"]
    assert command[2].split(":") == ["/opt/ragpulse/ragpulse-kafka-read.jar",
                                     "/opt/apache/beam/jars/beam-runners-flink-job-server.jar"]
    assert command[3] == flink_runner.FLINK_JOB_SERVER
    assert flink_runner.beam_classpath().split(":")[0] == str(flink_runner.kafka_read_jar())
    wrapper = (REPO / "java" / "kafka-read" / "src" / "main" / "java" / "org" / "apache" /
               "beam" / "runners" / "flink" / "translation" / "wrappers" / "streaming" / "io" /
               "UnboundedSourceWrapper.java")
    assert wrapper.is_file()


def test_the_dataflow_launcher_image_holds_the_jars_its_expansion_service_runs() -> None:
    """The launcher (deploy/dataflow/launch.py) starts the expansion service from the two jars
    its Dockerfile puts in /opt/beam: Beam's expansion service and ragpulse's read, built from
    this repository's sources as deploy/flink's images build it."""
    dockerfile = (DATAFLOW / "Dockerfile").read_text(encoding="utf-8")
    assert "COPY java/kafka-read /src" in dockerfile
    assert "mvn -q -B -f /src/pom.xml package" in dockerfile
    put = set(re.findall(r"(/opt/beam/[\w.-]+\.jar)$", dockerfile, re.MULTILINE))
    assert set(launcher().EXPANSION_CLASSPATH.split(":")) == put
    assert launcher().EXPANSION_SERVICE == flink_runner.EXPANSION_SERVICE
    assert "--experiments=use_deprecated_read" not in launcher().EXPANSION_ARGS


@pytest.mark.slow  # starts Beam's Java expansion service (a JVM): 12 s, a fifth of make test-fast
def test_the_dataflow_launcher_expands_ragpulses_read_and_stages_its_jar_for_the_workers(
    tmp_path: Path,
) -> None:
    """What the launcher does before it submits: its expansion service (here on the jars the
    tests build, RAGPULSE_EXPANSION_CLASSPATH's place) expands the stream's read into KafkaIO's
    splittable read (Dataflow Runner v2 runs it; the legacy read is Flink's) in Beam's Java SDK
    container, with ragpulse's jar among the artifacts staged for Dataflow's Java workers."""
    import hashlib

    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from ragpulse.pipeline.graphs.unbounded import ReadKafkaStream

    jar = flink_runner.kafka_read_jar()
    with launcher().expansion_service(flink_runner.beam_classpath()) as address:
        pipeline = beam.Pipeline(
            options=PipelineOptions(["--streaming", f"--temp_location={tmp_path}"])
        )
        _ = pipeline | ReadKafkaStream(
            "127.0.0.1:9092", "inference-logs", address, {"group.id": "g"},
            out_of_orderness_s=30, partition_idle_after_s=60,
        )
        proto = pipeline.to_runner_api()
    names = [t.unique_name for t in proto.components.transforms.values()]
    assert any(n.endswith("KafkaIO.Read.ReadFromKafkaViaSDF") for n in names)
    assert not any("ReadFromKafkaViaUnbounded" in n for n in names)
    (java,) = [e for e in proto.components.environments.values()
               if e.urn == "beam:env:docker:v1"]
    assert f"apache/beam_java17_sdk:{beam_pin()}".encode() in java.payload
    digest = hashlib.sha256(jar.read_bytes()).hexdigest().encode()
    assert any(digest in artifact.type_payload for artifact in java.dependencies)
