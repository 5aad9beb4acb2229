"""``fairgang sim``: replay a workload through several policies and write a report with plots."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="The trace-driven scheduling simulator.", no_args_is_help=True)


def _workload(name: str, fleet: object, *, seed: int, load: float, jobs: int | None, elastic_share: float = 0.0) -> object:
    from simulator.fleet import Fleet
    from simulator.workload import csv_workload, make_elastic, philly_workload, synthetic_workload

    assert isinstance(fleet, Fleet)
    if name == "philly":
        wl = philly_workload(fleet, seed=seed, load=load, jobs=jobs)
    elif name == "synthetic":
        wl = synthetic_workload(fleet, seed=seed, load=load, jobs=jobs or 10_000)
    else:
        wl = csv_workload(name, fleet, seed=seed, load=load, jobs=jobs)
    return make_elastic(wl, fleet, elastic_share, seed=seed)


@app.command()
def sim(
    workload: Annotated[
        str, typer.Option(help="philly, synthetic, or the path of a CSV (Philly columns or the simulator's own).")
    ] = "philly",
    fleet: Annotated[str, typer.Option(help="'spec' (750 nodes, 5,000 GPUs) or a cluster config file, as for `fairgang dev`.")] = "spec",
    policies: Annotated[
        str,
        typer.Option(
            help="Comma-separated: ours, ours-rigid (elastic jobs fixed at their maximum), fifo, priority, multifactor, drf, las, sjf."
        ),
    ] = ("ours,fifo,priority,multifactor,drf,las,sjf"),
    load: Annotated[float, typer.Option(help="Target offered load (time compression of the trace; arrival rate of the generator).")] = 0.7,
    jobs: Annotated[int | None, typer.Option(help="Number of jobs (default: the whole trace; 10,000 synthetic).")] = None,
    out: Annotated[Path, typer.Option(help="Folder for report.md, summary.json and the PNG plots.")] = Path("sim-out"),
    seed: Annotated[int, typer.Option(help="Seeds the workload rules, the generator and failures.")] = 0,
    cycle_s: Annotated[float, typer.Option(help="Scheduling cycles land on this grid (seconds of simulated time).")] = 30.0,
    node_mtbf_h: Annotated[float | None, typer.Option(help="Mean time between failures of one node, hours (default: none).")] = None,
    gpu_mtbf_h: Annotated[float | None, typer.Option(help="Mean time between fatal faults of one GPU, hours (default: none).")] = None,
    estimate: Annotated[str, typer.Option(help="Policies whose queue-wait estimates are scored (comma-separated; '' for none).")] = "ours",
    estimate_every_h: Annotated[float, typer.Option(help="Simulated hours between two estimator probes.")] = 6.0,
    title: Annotated[str | None, typer.Option(help="Report title.")] = None,
    elastic_share: Annotated[
        float, typer.Option(help="Share of multi-GPU jobs made elastic (maximum = recorded size, minimum = half; seeded).")
    ] = 0.0,
) -> None:
    """Simulate the policies on one workload and fleet; write report.md and plots into OUT."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from simulator.compare import run_set, write_summary_json
    from simulator.engine import SimOptions
    from simulator.fleet import load_fleet
    from simulator.policies import get_policy
    from simulator.report import write_report
    from simulator.workload import Workload

    console = Console(stderr=True)
    names = [p.strip() for p in policies.split(",") if p.strip()]
    try:
        for name in names:
            get_policy(name)
        the_fleet = load_fleet(fleet)
        wl = _workload(workload, the_fleet, seed=seed, load=load, jobs=jobs, elastic_share=elastic_share)
    except (ValueError, OSError) as err:
        console.print(f"[red]{err}[/red]")
        raise typer.Exit(2) from None
    assert isinstance(wl, Workload)
    options = SimOptions(cycle_s=cycle_s, node_mtbf_h=node_mtbf_h, gpu_mtbf_h=gpu_mtbf_h, seed=seed)
    command = "fairgang sim " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if len(sys.argv) > 2 else "fairgang sim"
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console) as bar:
        tasks = {n: bar.add_task(f"{n:>12}", total=len(wl.jobs)) for n in names}

        def progress(name: str, done: int, total: int) -> None:
            bar.update(tasks[name], completed=done, total=total)

        runs = run_set(
            wl,
            the_fleet,
            names,
            title=title or f"{wl.name} at load {load:g}",
            command=command,
            options=options,
            estimate_for=[p for p in estimate.split(",") if p in names],
            estimate_every_s=estimate_every_h * 3600.0,
            progress=progress,
        )
    report = write_report(runs, out)
    write_summary_json(runs, out / "summary.json")
    for name, r in runs.results.items():
        console.print(
            f"{name:>12}: {len(r.records) / max(r.wall_s, 1e-9):,.0f} simulated jobs/s ({r.wall_s:.1f} s, policy {r.policy_s:.1f} s)"
        )
    console.print(f"report: {report}")


if __name__ == "__main__":
    app()
