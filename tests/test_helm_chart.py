"""The Helm chart (deploy/helm/ragpulse) through the real Helm (`make helm` builds v3.22.0 from
helm.sh/helm/v3): `helm lint --strict` and `helm template` pass for the default values and for
option sets that between them change every value documented in values.yaml (each change is
checked to show in the output), every rendered object is valid against the Kubernetes API
schemas shipped by kubernetes-validate, and the ragpulse command line and settings file that
the chart renders are accepted by the real CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from helm_chart import CHART, lint, manifests, template_text

pytestmark = [pytest.mark.helm, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy"
RULE_FILES = [DEPLOY / "prometheus" / "rules" / n for n in ("ragpulse.rules.yml",
                                                            "ragpulse.alerts.yml")]
# The Kubernetes version whose API schemas the manifests are validated against.
KUBERNETES = "1.30.0"

SECURED: dict[str, Any] = {
    "kafka": {
        "bootstrap": "kafka-0.kafka.svc:9093,kafka-1.kafka.svc:9093",
        "deadLetterTopic": "chat-inference.rejected",
        "verdictsTopic": "chat-inference.judged",
        "security": {
            "protocol": "SASL_SSL",
            "checkHostname": False,
            "tls": {"secretName": "kafka-ca", "caKey": "ca.pem", "certKey": "tls.crt",
                    "keyKey": "tls.key", "keyPasswordKey": "key-password"},
            "sasl": {"mechanism": "SCRAM-SHA-512", "username": "ragpulse",
                     "secretName": "kafka-ragpulse-user", "passwordKey": "secret"},
            "propertiesSecret": "kafka-client-properties",
            "propertiesKey": "consumer.properties",
        },
    },
    "judges": {"backend": "openai", "baseUrl": "https://llm.internal/v1",
               "apiKeySecret": {"name": "ragpulse-judge", "key": "openai_key"}},
    "state": {"persistence": {"enabled": True, "size": "5Gi", "storageClass": "fast-ssd"}},
    "extraArgs": ["--sample-rate=0.5"],
    "settings": {"store-text": "none"},
}
OAUTH: dict[str, Any] = {
    "kafka": {"security": {
        "protocol": "SASL_SSL",
        "tls": {"secretName": "kafka-ca", "caKey": ""},  # no CA file: the system trust store
        "sasl": {"mechanism": "OAUTHBEARER", "secretName": "kafka-token",
                 "oauthTokenKey": "token"},
    }},
}
TUNED: dict[str, Any] = {
    "name": "ragpulse-eu",
    "image": {"repository": "registry.example/ragpulse", "tag": "0.1.0",
              "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry-login"}],
    "kafka": {"bootstrap": "kafka.eu:9092", "topic": "chat-eu", "publishVerdicts": "all",
              "groupId": "ragpulse-eu", "maxBatchEvents": "1000000", "timeout": "45s",
              "security": {"protocol": "SSL", "tls": {"secretName": "kafka-eu-ca"}}},
    "windows": {"sampleRate": 0.25, "window": "10m", "allowedLateness": "20m",
                "outOfOrderness": "1m", "triggerInterval": "30s", "maxEventBytes": "2097152"},
    "judges": {"names": "groundedness,safety", "model": "gpt-4.1-mini", "concurrency": 4,
               "timeout": "60s", "maxRetries": 2, "temperature": 0.0},
    "service": {"metricsPort": 9500, "healthPort": 9501, "unhealthyAfter": "10m", "retention": "7d",
                "logLevel": "DEBUG"},
    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "3Gi"}},
    "nodeSelector": {"kubernetes.io/arch": "amd64"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "monitoring",
                     "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["monitoring"]}]}]}}},
    "podAnnotations": {"example.com/team": "ml-platform"},
    "serviceMonitor": {"interval": "30s", "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"labels": {"role": "ragpulse-alerts", "release": "kube-prometheus-stack"}},
    "grafanaDashboards": {"labels": {"grafana_dashboard": "ragpulse"},
                          "annotations": {"grafana_folder": "ragpulse"},
                          "files": ["ragpulse-overview.json"]},
    "judgePromptFiles": ["groundedness.yaml", "safety.yaml"],
}
SWITCHED_OFF: dict[str, Any] = {
    "serviceMonitor": {"enabled": False},
    "prometheusRule": {"enabled": False},
    "grafanaDashboards": {"enabled": False},
    "judges": {"mountPrompts": False},
}
CUSTOM_JUDGES: dict[str, Any] = {
    "customJudges": {"no_pricing_promises.yaml": (
        DEPLOY / "samples" / "no_pricing_promises.yaml").read_text(encoding="utf-8")},
    "judges": {"names": "groundedness,no_pricing_promises", "backend": "openai",
               "baseUrl": "http://vllm:8000/v1"},
}
REVIEW: dict[str, Any] = {
    "review": {
        "rate": 0.02, "maxPerHour": 500, "reviewTopic": "chat-inference.to-review",
        "labelsTopic": "chat-inference.human-labels", "targets": "failing,unsure",
        "unsureBand": 0.2,
        "page": {"enabled": True, "port": 9480, "webConfigSecret": "review-web",
                 "webConfigKey": "web.yml", "bearerTokenSecret": "review-tokens",
                 "bearerTokenKey": "reviewers",
                 "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                               "limits": {"memory": "1Gi"}}},
    },
}
# The page on a secured Kafka: the same security flags and mounts as serve's.
SECURED_REVIEW: dict[str, Any] = {
    **SECURED, "review": {"page": {"enabled": True, "bearerTokenSecret": "review-tokens"}},
}
OPTION_SETS: dict[str, dict[str, Any]] = {
    "defaults": {}, "secured": SECURED, "oauth": OAUTH, "tuned": TUNED,
    "switched-off": SWITCHED_OFF, "custom-judges": CUSTOM_JUDGES, "review": REVIEW,
    "secured-review": SECURED_REVIEW,
}


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def container_of(objects: list[dict[str, Any]], component: str = "serve") -> dict[str, Any]:
    """The container of the Deployment of `component` (serve, or the review page)."""
    (deployment,) = [d for d in by_kind(objects, "Deployment")
                     if d["metadata"]["labels"]["app.kubernetes.io/component"] == component]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def leaves(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Path -> value of every documented value: a non-empty mapping is walked into, anything
    else (scalars, lists, empty mappings to fill in) is one value."""
    found: dict[tuple[str, ...], Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            found.update(leaves(value, (*prefix, key)))
        else:
            found[(*prefix, key)] = value
    return found


_UNSET = object()


def value_at(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    """The value (or subtree) at `path` in `values`, _UNSET where `values` does not set it."""
    node: Any = values
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return _UNSET
        node = node[key]
    return node


def without(values: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """`values` with the value at `path` removed (the chart's default then applies)."""
    copied = copy.deepcopy(values)
    node = copied
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return copied


DEFAULTS = leaves(yaml.safe_load((CHART / "values.yaml").read_text(encoding="utf-8")))


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_helm_lint_strict_passes(name: str) -> None:
    done = lint(OPTION_SETS[name])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_helm_template_renders_objects_valid_against_the_kubernetes_schemas(name: str) -> None:
    import kubernetes_validate

    objects = manifests(OPTION_SETS[name])
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service"} <= kinds
    for obj in objects:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # prometheus-operator CRDs: kubernetes-validate ships built-in kinds only
        try:
            kubernetes_validate.validate(obj, KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message}")


@pytest.mark.parametrize("name", ["defaults", "tuned"])
def test_helm_probes_ask_the_health_listener_that_serve_is_told_to_open(name: str) -> None:
    from ragpulse.pipeline.cli import build_parser
    from ragpulse.pipeline.commands.serve import ServeSettings

    container = container_of(manifests(OPTION_SETS[name]))
    args = build_parser().parse_args(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["health"] == args.health_port != args.metrics_port == ports["metrics"]
    # Reachable from the kubelet: on the pod address, not serve's default of loopback.
    assert args.metrics_host == "0.0.0.0"
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}, probe
    if name == "defaults":  # the chart's default is serve's
        assert args.health_port == ServeSettings.model_fields["health_port"].default


def test_every_documented_value_is_set_by_an_option_set_and_changes_the_output() -> None:
    unexercised = []
    for path, default in DEFAULTS.items():
        setters = [name for name, values in OPTION_SETS.items()
                   if value_at(values, path) not in (_UNSET, default)]
        if not setters:
            unexercised.append(".".join(path))
            continue
        values = OPTION_SETS[setters[0]]
        assert template_text(values) != template_text(without(values, path)), (
            f"{'.'.join(path)} in option set {setters[0]} changes nothing that helm renders")
    assert not unexercised, f"values.yaml options no test renders: {unexercised}"


def test_option_sets_use_only_documented_values() -> None:
    for name, values in OPTION_SETS.items():
        for path in leaves(values):
            # A documented value, inside one (a map to fill in), or beside one (a new key of a
            # documented map, e.g. another label).
            assert any(path[:len(d)] == d or path[:-1] == d[:-1] for d in DEFAULTS), (
                f"{name}: {'.'.join(path)}")


def test_schema_validation_rejects_a_misplaced_deployment_field() -> None:
    import kubernetes_validate

    (deployment,) = by_kind(manifests(), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["arg"] = ["serve"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def test_helm_lint_fails_on_a_value_of_the_wrong_type() -> None:
    # The real Helm refuses what its template functions cannot take, so lint can fail here.
    done = lint({"kafka": {"security": "none"}})
    assert done.returncode != 0


@pytest.mark.parametrize("name", list(OPTION_SETS))
def test_helm_deployment_command_is_accepted_by_the_real_cli(name: str) -> None:
    from ragpulse.pipeline.cli import build_parser

    container = container_of(manifests(OPTION_SETS[name]))
    try:
        args = build_parser().parse_args(container["args"])
    except SystemExit:
        pytest.fail(f"ragpulse rejects {container['args']}")
    assert args.command == "serve"
    if name == "defaults":
        assert args.max_event_bytes == 1_048_576 and args.max_batch_events == 50_000
    if name == "tuned":
        assert (args.max_batch_events, args.max_event_bytes) == (1_000_000, 2_097_152)
        assert args.metrics_port == 9500 and args.kafka_security_protocol == "SSL"
        assert args.health_port == 9501
    if name == "secured":
        assert args.kafka_security_protocol == "SASL_SSL"
        assert args.kafka_sasl_password_file == Path("/etc/ragpulse/kafka/sasl/secret")
        assert args.kafka_ssl_cafile == Path("/etc/ragpulse/kafka/tls/ca.pem")
        assert args.kafka_properties == Path(
            "/etc/ragpulse/kafka/properties/consumer.properties")
        assert args.sample_rate == 0.5  # extraArgs come last and win
    if name == "oauth":
        assert args.kafka_sasl_oauth_token_file == Path("/etc/ragpulse/kafka/sasl/token")
        assert args.kafka_ssl_cafile is None


def test_helm_settings_become_a_config_file_that_the_real_cli_takes_under_the_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragpulse.pipeline.cli import main

    settings = {"canary-rate": 2, "redact-pattern": ["ACME-[0-9]+"], "window": "1m"}
    objects = manifests({"settings": settings})
    (configmap,) = [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"]
                    == "ragpulse-settings"]
    config = tmp_path / "ragpulse.yaml"
    config.write_text(configmap["data"]["ragpulse.yaml"])
    spec = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    container = spec["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "settings")
    assert mount["mountPath"] == "/etc/ragpulse/settings"
    assert any(v["name"] == "settings" and v["configMap"]["name"] == "ragpulse-settings"
               for v in spec["volumes"])
    args = [a.replace("/etc/ragpulse/settings/ragpulse.yaml", str(config))
            for a in container["args"] if not a.startswith("--judge-prompts")]
    assert f"--config={config}" in args
    assert main([*args, "--print-config"]) == 0
    effective = yaml.safe_load(capsys.readouterr().out)
    assert effective["canary-rate"] == 2.0
    assert effective["redact-pattern"] == ["ACME-[0-9]+"]
    assert effective["window"] == "5m"  # the chart's --window flag overrides the file


def test_helm_renders_no_settings_file_without_settings() -> None:
    objects = manifests()
    assert not [o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"]
                == "ragpulse-settings"]
    assert not any(a.startswith("--config") for a in container_of(objects)["args"])


def test_helm_mounts_kafka_and_judge_secrets_as_files_and_never_renders_a_secret() -> None:
    objects = manifests(SECURED)
    assert not by_kind(objects, "Secret")
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"kafka-tls": "kafka-ca", "kafka-sasl": "kafka-ragpulse-user",
                       "kafka-properties": "kafka-client-properties"}
    container = pod["containers"][0]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["kafka-sasl"] == "/etc/ragpulse/kafka/sasl"
    assert not any("password" in a and "file" not in a for a in container["args"])
    assert container["env"] == [{"name": "OPENAI_API_KEY", "valueFrom": {"secretKeyRef": {
        "name": "ragpulse-judge", "key": "openai_key"}}}]
    (claim,) = by_kind(objects, "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "fast-ssd"


def test_helm_service_monitor_and_job_name_match_what_the_alerts_expect() -> None:
    objects = manifests()
    deployment, service = by_kind(objects, "Deployment")[0], by_kind(objects, "Service")[0]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = by_kind(objects, "ServiceMonitor")[0]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"][
        "labels"].items()
    thresholds = yaml.safe_load((DEPLOY / "prometheus" / "thresholds.yml").read_text("utf-8"))
    assert service["metadata"]["name"] == thresholds["job"]


def test_helm_switched_off_parts_render_nothing() -> None:
    objects = manifests(SWITCHED_OFF)
    assert not by_kind(objects, "ServiceMonitor") and not by_kind(objects, "PrometheusRule")
    names = {o["metadata"]["name"] for o in by_kind(objects, "ConfigMap")}
    assert names == set(), names
    assert not any(a.startswith("--judge-prompts") for a in container_of(objects)["args"])


def test_helm_prometheus_rules_are_the_committed_rule_files_verbatim() -> None:
    rules = by_kind(manifests(), "PrometheusRule")
    groups = [g for r in rules for g in r["spec"]["groups"]]
    committed = [g for path in RULE_FILES
                 for g in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]]
    assert groups == committed


def test_helm_dashboards_are_configmaps_for_the_grafana_sidecar_holding_every_dashboard() -> None:
    maps = [m for m in by_kind(manifests(), "ConfigMap")
            if m["metadata"]["labels"].get("grafana_dashboard") == "1"]
    shipped = {p.name: p.read_text(encoding="utf-8")
               for p in (REPO / "grafana" / "dashboards").glob("*.json")}
    assert {k: v for m in maps for k, v in m["data"].items()} == shipped
    for text in shipped.values():
        json.loads(text)


def test_helm_judge_prompts_configmap_holds_the_prompt_files_and_is_mounted() -> None:
    objects = manifests()
    prompts = next(m for m in by_kind(objects, "ConfigMap")
                   if m["metadata"]["name"] == "ragpulse-judge-prompts")
    shipped = {p.name: p.read_text(encoding="utf-8")
               for p in sorted((REPO / "judges" / "prompts").glob("*.yaml"))}
    assert prompts["data"] == shipped
    pod = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]
    assert {"name": "judge-prompts", "configMap": {"name": "ragpulse-judge-prompts"}} in pod[
        "volumes"]


@pytest.mark.parametrize("name", ["review", "secured-review"])
def test_helm_review_page_runs_the_real_review_command_with_serves_kafka_settings(
    name: str, tmp_path: Path
) -> None:
    from ragpulse.pipeline.cli import COMMANDS, build_parser
    from ragpulse.pipeline.settings.command_flags import settings_from

    objects = manifests(OPTION_SETS[name])
    page = container_of(objects, "review")
    args = build_parser().parse_args(page["args"])
    assert args.command == "review" and args.host == "0.0.0.0"
    assert {"name": "http", "containerPort": args.port} in page["ports"]
    serve = build_parser().parse_args(container_of(objects)["args"])
    for flag in ("kafka_bootstrap", "topic", "kafka_security_protocol", "kafka_ssl_cafile",
                 "kafka_sasl_password_file", "kafka_properties", "kafka_timeout"):
        assert getattr(args, flag) == getattr(serve, flag), flag
    mounts = {m["mountPath"] for m in page["volumeMounts"]}
    assert {m["mountPath"] for m in container_of(objects)["volumeMounts"]
            if "/kafka/" in m["mountPath"]} <= mounts
    if name == "review":
        assert args.web_config_file == Path("/etc/ragpulse/review/web/web.yml")
        assert args.bearer_token_file == Path("/etc/ragpulse/review/tokens/reviewers")
        assert (args.review_topic, args.labels_topic) == (
            "chat-inference.to-review", "chat-inference.human-labels")
        assert (serve.review_rate, serve.review_max_per_hour, serve.review_topic) == (
            0.02, 500, "chat-inference.to-review")
        # serve reads the labels the page writes, and queues what the values say.
        assert serve.labels_topic == "chat-inference.human-labels"
        assert (serve.review_targets, serve.review_unsure_band) == ("failing,unsure", 0.2)
        assert page["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
        (service,) = [o for o in by_kind(objects, "Service")
                      if o["metadata"]["name"] == "ragpulse-review"]
        assert service["spec"]["ports"][0]["port"] == 9480
        # The settings build as the command builds them (files as the Secrets would hold).
        tokens = tmp_path / "tokens"
        tokens.write_text("ana " + "0" * 64 + "\n")
        args.bearer_token_file, args.web_config_file = tokens, None
        settings = settings_from(COMMANDS["review"].flags, args)
        assert settings.dead_letter_topic == "chat-inference.to-review.dlq"
    else:
        assert args.web_config_file is None and args.kafka_ssl_cafile is not None
        assert page["readinessProbe"]["httpGet"]["scheme"] == "HTTP"


def test_helm_review_page_without_a_login_secret_is_refused() -> None:
    from helm_chart import RELEASE, _helm

    done = _helm("template", RELEASE, str(CHART), values={"review": {"page": {"enabled": True}}})
    assert done.returncode != 0
    assert "needs review.page.webConfigSecret" in done.stdout + done.stderr
