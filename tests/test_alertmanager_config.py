"""The Alertmanager configuration is valid for amtool and routes ragpulse alerts by severity."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from processes import require_binary

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "alertmanager" / "alertmanager.yml"


def amtool() -> str:
    return require_binary("amtool", "prometheus-alertmanager")


def route_for(*labels: str, expect: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [amtool(), "config", "routes", "test", f"--config.file={CONFIG}",
         f"--verify.receivers={expect}", *labels],
        capture_output=True, text=True, check=False, timeout=30,
    )


def test_alertmanager_config_passes_amtool_check() -> None:
    result = subprocess.run([amtool(), "check-config", str(CONFIG)], capture_output=True,
                            text=True, check=False, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (("alertname=RagGroundednessDrop", "severity=critical", "app=shop"), "pager"),
        (("alertname=RagSafetyViolations", "severity=critical", "app=shop"), "pager"),
        (("alertname=RagPulseDown", "severity=critical"), "pager"),
        (("alertname=RagRelevanceDrop", "severity=warning", "app=shop"), "chat"),
        (("alertname=RagConsumerLagHigh", "severity=warning", "topic=t"), "chat"),
        (("alertname=Unrelated",), "chat"),
    ],
)
def test_alerts_route_to_the_receiver_for_their_severity(
    labels: tuple[str, ...], receiver: str
) -> None:
    result = route_for(*labels, expect=receiver)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_critical_alert_is_not_sent_to_chat() -> None:
    # The route test itself must be able to fail.
    result = route_for("alertname=RagGroundednessDrop", "severity=critical", expect="chat")
    assert result.returncode != 0


def test_alerts_are_grouped_by_alertname_and_app() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    assert config["route"]["group_by"] == ["alertname", "app"]


def test_default_receivers_are_webhooks_with_resolved_notifications() -> None:
    config = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    for receiver in config["receivers"]:
        hooks = receiver["webhook_configs"]
        assert hooks and all(h["url"].startswith("http") and h["send_resolved"] for h in hooks)
    text = CONFIG.read_text(encoding="utf-8")
    assert "# slack_configs:" in text and "# pagerduty_configs:" in text


def test_pages_wait_only_ten_seconds_while_warnings_stay_grouped_for_thirty() -> None:
    route = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["route"]
    by_severity = {r["matchers"][0]: r for r in route["routes"]}
    assert by_severity['severity="critical"']["group_wait"] == "10s"
    # Warnings (and anything unmatched) inherit the root's grouping delay.
    assert "group_wait" not in by_severity['severity="warning"']
    assert route["group_wait"] == "30s"
