"""The live workers' alerts, evaluated by promtool's rule unit tests (`promtool test rules`).

Each alert gets series that must make it fire and series that must not, in namespaces of their own,
evaluated by Prometheus' own rule engine over helm/lipline/files/prometheus-rules.yaml as shipped
(recording rules included): a latency p95 above 350 ms for 5 minutes, skipped or dropped frames
above 1% of the frame slots for 5 minutes, admission refusals for 10 minutes. An alert still in its
`for` window is pending, not firing, so each is also checked before its window has passed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm.test_chart import CHART

RULES = CHART / "files" / "prometheus-rules.yaml"
POD = "lip-lipline-live-7c9f5-x2x4q"


def _rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}


def _description(alert: str) -> str:
    return _rules()[alert]["annotations"]["description"]


def _latency_buckets(namespace: str, per_minute: dict[str, int]) -> list[dict[str, str]]:
    """lipline_live_frame_latency_seconds_bucket growing by `per_minute[le]` frames a minute."""
    return [
        {
            "series": f'lipline_live_frame_latency_seconds_bucket{{namespace="{namespace}",pod="{POD}",le="{le}"}}',
            "values": f"0+{n}x30",
        }
        for le, n in per_minute.items()
    ]


def _frames(namespace: str, per_minute: dict[str, int]) -> list[dict[str, str]]:
    return [
        {
            "series": f'lipline_live_frames_total{{namespace="{namespace}",pod="{POD}",kind="{kind}"}}',
            "values": f"0+{n}x30",
        }
        for kind, n in per_minute.items()
    ]


def _fired(alert: str, namespace: str, summary: str) -> dict[str, Any]:
    return {
        "exp_labels": {"severity": "warning", "namespace": namespace},
        "exp_annotations": {"summary": summary, "description": _description(alert)},
    }


def _tests() -> list[dict[str, Any]]:
    latency = {
        "interval": "1m",
        "input_series": [
            # 10% of the speech frames above 350 ms: p95 = 0.35 + 0.15 * (50 / 100) = 425 ms.
            *_latency_buckets("slow", {"0.25": 850, "0.35": 900, "0.5": 1000, "+Inf": 1000}),
            # 3% above 350 ms: the p95 stays in the bucket below.
            *_latency_buckets("fast", {"0.25": 900, "0.35": 970, "0.5": 1000, "+Inf": 1000}),
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "LiplineLiveLatencyHigh", "exp_alerts": []},  # pending: not 5 minutes yet
            {
                "eval_time": "15m",
                "alertname": "LiplineLiveLatencyHigh",
                "exp_alerts": [
                    _fired(
                        "LiplineLiveLatencyHigh",
                        "slow",
                        "lipline live sessions: frame latency p95 425ms (audio in to frame out; the budget is 350 ms)",
                    )
                ],
            },
        ],
    }
    frames = {
        "interval": "1m",
        "input_series": [
            # 8 skipped and 8 dropped of 1,516 slots a minute: each under 1%, together 1.055%.
            *_frames("lossy", {"speech": 1400, "idle": 100, "skipped": 8, "dropped": 8}),
            # 10 of 1,510: 0.66%.
            *_frames("fine", {"speech": 1400, "idle": 100, "skipped": 5, "dropped": 5}),
            # No frame ever lost: the skipped and dropped series do not exist.
            *_frames("clean", {"speech": 1400, "idle": 100}),
        ],
        "alert_rule_test": [
            {"eval_time": "5m", "alertname": "LiplineLiveFramesLost", "exp_alerts": []},
            {
                "eval_time": "15m",
                "alertname": "LiplineLiveFramesLost",
                "exp_alerts": [
                    _fired(
                        "LiplineLiveFramesLost", "lossy", "lipline live sessions: 1.055% of frames skipped or dropped"
                    )
                ],
            },
        ],
    }
    refused = "lipline live sessions: new sessions refused for lack of room (0.05 per second)"
    gateway = 'lipline_stage_requests_total{{namespace="{ns}",pod="lip-lipline-gateway-5d8b9-q7w2e",stage="gateway",method="CreateSession",code="{code}"}}'
    admission = {
        "interval": "1m",
        "input_series": [
            # A worker refuses 3 OpenSession calls a minute (full by the time the gateway asked).
            {
                "series": f'lipline_live_admission_refused_total{{namespace="workers-full",pod="{POD}"}}',
                "values": "0+3x30",
            },
            # Every worker full: the gateway asks none and refuses CreateSession itself.
            {"series": gateway.format(ns="pool-full", code="RESOURCE_EXHAUSTED"), "values": "0+3x30"},
            {"series": gateway.format(ns="pool-full", code="OK"), "values": "0+60x30"},
            # Refusals for 3 minutes, then none: a burst the HPA absorbed.
            {
                "series": f'lipline_live_admission_refused_total{{namespace="burst",pod="{POD}"}}',
                "values": "0+5x3 15+0x27",
            },
            # Sessions created, none refused.
            {"series": gateway.format(ns="roomy", code="OK"), "values": "0+60x30"},
        ],
        "alert_rule_test": [
            {
                "eval_time": "9m",
                "alertname": "LiplineLiveAdmissionRefused",
                "exp_alerts": [],
            },  # pending: not 10 minutes yet
            {
                "eval_time": "20m",
                "alertname": "LiplineLiveAdmissionRefused",
                "exp_alerts": [
                    _fired("LiplineLiveAdmissionRefused", "pool-full", refused),
                    _fired("LiplineLiveAdmissionRefused", "workers-full", refused),
                ],
            },
        ],
    }
    return [latency, frames, admission]


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (Debian package 'prometheus'; bash scripts/install.sh installs it)")
    return promtool


def _run(tmp_path: Path, tests: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "live-alerts-test.yaml"
    path.write_text(
        yaml.safe_dump({"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": tests}, sort_keys=False)
    )
    return subprocess.run([_promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=120)


def test_the_live_alerts_fire_on_their_conditions_and_only_on_them(tmp_path: Path) -> None:
    result = _run(tmp_path, _tests())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_unit_tests_could_fail(tmp_path: Path) -> None:
    """promtool fails a test whose alert does not fire as written: the latency alert expected for
    the namespace whose p95 is under 350 ms too."""
    tests = _tests()[:1]
    firing = tests[0]["alert_rule_test"][1]["exp_alerts"]
    firing.append({**firing[0], "exp_labels": {"severity": "warning", "namespace": "fast"}})
    result = _run(tmp_path, tests)
    assert result.returncode != 0 and "LiplineLiveLatencyHigh" in result.stdout + result.stderr


def test_the_live_alerts_wait_as_long_as_the_brief_says() -> None:
    rules = _rules()
    assert (
        rules["LiplineLiveLatencyHigh"]["for"],
        rules["LiplineLiveFramesLost"]["for"],
        rules["LiplineLiveAdmissionRefused"]["for"],
    ) == ("5m", "5m", "10m")
