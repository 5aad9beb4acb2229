"""``fairgang whatif``: its options become the API's request, its answer a table per tenant (and per job), and a
malformed option is one clear error naming it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from cli import whatif as cli_whatif
from cli.main import app

NOW = 1_796_212_800.0
ANSWER: dict[str, Any] = {
    "now": NOW,
    "horizon_s": 7200.0,
    "changes": ["drain node h1 (no new work; its jobs run to their end)"],
    "tenants": [
        {
            "tenant": "alpha", "waiting": 2, "mean_wait_before_s": 600.0, "mean_wait_after_s": 4500.0, "median_wait_before_s": 600.0,
            "median_wait_after_s": 7200.0, "started_before": 2, "started_after": 1,
        },
        {
            "tenant": "*", "waiting": 2, "mean_wait_before_s": 600.0, "mean_wait_after_s": 4500.0, "median_wait_before_s": 600.0,
            "median_wait_after_s": 7200.0, "started_before": 2, "started_after": 1,
        },
    ],
    "jobs": [
        {"job_id": "j-1", "tenant": "alpha", "gpu_type": "H100", "gpu_count": 8, "before": NOW + 600, "after": NOW + 1800,
         "shift_s": 1200.0},
        {"job_id": "j-2", "tenant": "alpha", "gpu_type": "H100", "gpu_count": 8, "before": NOW + 600, "after": None, "shift_s": None},
    ],
}  # fmt: skip


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The bodies the command posts (to a stand-in API that answers ``ANSWER``)."""
    bodies: list[dict[str, Any]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/admin/whatif" and request.method == "POST"
        assert request.extensions["timeout"]["read"] >= cli_whatif.TIMEOUT_S  # two replays of a large fleet take a while
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json=ANSWER)

    def client(api_url: str | None, token: str | None) -> httpx.Client:
        return httpx.Client(base_url="http://api", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_whatif, "_client", client)
    monkeypatch.setattr(cli_whatif, "console", Console(width=250))
    return bodies


def test_the_options_become_the_request(sent: list[dict[str, Any]]) -> None:
    args = [
        "whatif", "--weight", "alpha=2.5", "--quota", "beta:H100-80GB=8:4", "--quota", "beta:L40S=none",
        "--add", "2xH100-80GB:8@leaf=l1,spine=s1", "--add", "1xL40S:4", "--drain", "h1", "--drain", "h2",
        "--set", "backfill=false", "--set", "aging_per_hour=20", "--hours", "6", "--jobs",
    ]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert sent == [
        {
            "hours": 6.0,
            "weights": {"alpha": 2.5},
            "quotas": {"beta": {"H100-80GB": {"nominal": 8, "borrow_limit": 4}, "L40S": None}},
            "add_nodes": [
                {"count": 2, "gpu_type": "H100-80GB", "gpus": 8, "domain": {"leaf": "l1", "spine": "s1"}},
                {"count": 1, "gpu_type": "L40S", "gpus": 4, "domain": {}},
            ],
            "drain": ["h1", "h2"],
            "policy": {"backfill": "false", "aging_per_hour": "20"},
            "jobs": True,
        }
    ]


def test_the_answer_is_a_table_per_tenant_and_per_job(sent: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(app, ["whatif", "--drain", "h1", "--jobs", "--hours", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "change: drain node h1" in out
    alpha = next(line for line in out.splitlines() if line.startswith("│ alpha"))
    cells = [c.strip() for c in alpha.strip("│").split("│")]
    # Mean 10m -> at least 1h15m (a job no longer starts within the 2 h), median 10m -> at least 2h; 2 -> 1 start.
    assert cells == ["alpha", "2", "10m → ≥1h15m (+1h5m)", "10m → ≥2h (+1h50m)", "2 → 1"]
    assert next(line for line in out.splitlines() if line.startswith("│ (all)"))
    j1 = next(line for line in out.splitlines() if line.startswith("│ j-1"))
    j2 = next(line for line in out.splitlines() if line.startswith("│ j-2"))
    assert "+20m" in j1 and "later" in j2 and "no longer within the horizon" in j2
    as_json = CliRunner().invoke(app, ["whatif", "-o", "json"])
    assert json.loads(as_json.output) == ANSWER


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--weight", "alpha"], "--weight: 'alpha' is not TENANT=WEIGHT"),
        (["--weight", "alpha=heavy"], "WEIGHT is a number"),
        (["--quota", "H100=8"], "--quota: 'H100=8' is not TENANT:TYPE="),
        (["--quota", "beta:H100=lots"], "whole numbers"),
        (["--quota", "beta:H100=1:2:3:4"], "more than NOMINAL:BORROW:LEND"),
        (["--add", "H100:8"], "--add: 'H100:8' is not COUNTxTYPE:GPUS"),
        (["--add", "twoxH100:8"], "COUNT and GPUS are whole numbers"),
        (["--add", "2xH100:8@leaf"], "--add: 'leaf' is not LEVEL=DOMAIN"),
        (["--set", "backfill"], "--set: 'backfill' is not NAME=VALUE"),
    ],
)
def test_a_malformed_option_is_named(sent: list[dict[str, Any]], args: list[str], words: str) -> None:
    result = CliRunner().invoke(app, ["whatif", *args])
    assert result.exit_code == 1 and sent == []
    assert words in " ".join(result.output.split()), result.output
