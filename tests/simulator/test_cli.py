"""`fairgang sim` end to end on a tiny workload."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from simulator.fleet import load_fleet
from simulator.workload import synthetic_workload, write_csv

ROOT = Path(__file__).resolve().parents[2]


def test_sim_writes_a_report_and_plots(tmp_path: Path):
    cluster = ROOT / "examples" / "cluster.yaml"
    wl = synthetic_workload(load_fleet(str(cluster)), seed=0, jobs=60, teams=3)
    write_csv(wl, tmp_path / "jobs.csv")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "sim",
            "--workload",
            str(tmp_path / "jobs.csv"),
            "--fleet",
            str(cluster),
            "--policies",
            "ours,fifo,multifactor",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    report = (out / "report.md").read_text()
    assert "| ours |" in report and "| multifactor |" in report
    for png in ("wait_cdf.png", "utilisation.png", "shares_ours.png"):
        assert (out / png).stat().st_size > 1000


def test_sim_refuses_an_unknown_policy(tmp_path: Path):
    result = CliRunner().invoke(app, ["sim", "--policies", "ours,nope", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "unknown policy" in result.output
