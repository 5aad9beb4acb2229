"""The markdown report and the PNG plots of a comparison run."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from simulator.engine import SimResult
from simulator.metrics import EstimateAccuracy, GroupStats, Summary, fair_shares
from simulator.workload import SIZE_CLASSES, size_class

HOUR = 3600.0


@dataclass
class RunSet:
    """One comparison: the same workload and fleet under several policies."""

    title: str
    #: Lines describing the workload, fleet and options.
    setup: list[str]
    command: str
    results: dict[str, SimResult] = field(default_factory=dict)
    summaries: dict[str, Summary] = field(default_factory=dict)
    estimates: dict[str, EstimateAccuracy] = field(default_factory=dict)
    jobs: int = 0


def _f(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def headline_table(runs: RunSet) -> list[str]:
    lines = [
        "| policy | avg JCT h | p50 | p90 | p99 | avg wait h | p50 | p90 | p99 | max wait h | makespan h | util | util/bound "
        "| Jain mean (min) | preemptions | GPU-h lost | stranded free | idle while waiting |",
        "|---|" + "---:|" * 18,
    ]
    for name, s in runs.summaries.items():
        o = s.overall
        lines.append(
            f"| {name} | {_f(o.avg_jct)} | {_f(o.p50_jct)} | {_f(o.p90_jct)} | {_f(o.p99_jct)} | {_f(o.avg_wait)} | {_f(o.p50_wait)} | "
            f"{_f(o.p90_wait)} | {_f(o.p99_wait)} | {_f(o.max_wait)} | {_f(s.makespan_h, 1)} | {s.utilisation:.1%} | "
            f"{s.util_vs_bound:.1%} | {s.jain_mean:.3f} ({s.jain_min:.3f}) | {s.preemptions} | {_f(s.lost_gpu_h, 0)} | "
            f"{s.stranded_frac:.1%} | {s.idle_while_waiting:.1%} |"
        )
    return lines


def _by(runs: RunSet, pick: str, groups: Sequence[str], getter: str) -> list[str]:
    names = list(runs.summaries)
    lines = [f"| {pick} | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for g in groups:
        cells = []
        for n in names:
            table: dict[str, GroupStats] = getattr(runs.summaries[n], "by_size" if pick == "size" else "by_tenant")
            st = table.get(g)
            cells.append(_f(getattr(st, getter)) if st else "-")
        count = next((getattr(runs.summaries[n], "by_size" if pick == "size" else "by_tenant").get(g) for n in names), None)
        label = f"{g} ({count.jobs} jobs)" if count else g
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def speed_table(runs: RunSet) -> list[str]:
    lines = ["| policy | wall s | of which policy s | cycles | simulated jobs/s |", "|---|---:|---:|---:|---:|"]
    for name, r in runs.results.items():
        lines.append(f"| {name} | {r.wall_s:.1f} | {r.policy_s:.1f} | {r.cycles} | {len(r.records) / max(r.wall_s, 1e-9):.0f} |")
    return lines


def markdown(runs: RunSet, plots: dict[str, str], *, heading: int = 1) -> str:
    h = "#" * heading
    any_summary = next(iter(runs.summaries.values()))
    tenants = list(any_summary.by_tenant)
    out = [f"{h} {runs.title}", "", *runs.setup, "", "Reproduce with:", "", "```", runs.command, "```", ""]
    out += [f"{h}# Overall (hours; shares of GPUs)", "", *headline_table(runs), ""]
    out += [f"{h}# Queueing delay by job size (GPUs): average, hours", "", *_by(runs, "size", SIZE_CLASSES, "avg_wait"), ""]
    out += [f"{h}# Queueing delay by job size (GPUs): p99, hours", "", *_by(runs, "size", SIZE_CLASSES, "p99_wait"), ""]
    out += [f"{h}# JCT by job size: average, hours", "", *_by(runs, "size", SIZE_CLASSES, "avg_jct"), ""]
    out += [f"{h}# Per tenant: average queueing delay, hours", "", *_by(runs, "tenant", tenants, "avg_wait"), ""]
    names = list(runs.summaries)
    out += [
        f"{h}# Per tenant: GPU-hours held over fair share (1.00 = fair)",
        "",
        "| tenant | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for t in tenants:
        out.append(f"| {t} | " + " | ".join(_f(runs.summaries[n].tenant_share_ratio.get(t, float("nan"))) for n in names) + " |")
    out.append("")
    if runs.estimates:
        out += [
            f"{h}# Queue-wait estimator (R7.2): predicted against actual start",
            "",
            "| policy | at submit: n | median abs err h | p90 abs err h | median signed err h "
            "| while waiting: n | median abs err h | p90 abs err h | beyond horizon |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, e in runs.estimates.items():
            out.append(
                f"| {name} | {e.at_submit} | {_f(e.at_submit_median_abs_h)} | {_f(e.at_submit_p90_abs_h)} | "
                f"{_f(e.at_submit_median_signed_h)} | "
                f"{e.while_waiting} | {_f(e.while_waiting_median_abs_h)} | {_f(e.while_waiting_p90_abs_h)} | {e.beyond_horizon} |"
            )
        out += [
            "",
            "Estimates made at least an hour before the job started, relative to that remaining wait, by job size "
            "(median absolute and signed error, and how often the p10-p90 interval held the start):",
            "",
            "| policy | size | estimates | median abs error | median signed error | interval coverage | within 10 min (all) "
            "| within 1 h (all) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name, e in runs.estimates.items():
            rows = [("all", e.long_wait), *e.long_wait_by_size.items()]
            for size, acc in rows:
                if acc is None:
                    continue
                out.append(
                    f"| {name} | {size} | {acc.n} | {acc.median_abs_rel:.1%} | {acc.median_signed_rel:+.1%} | {acc.coverage:.1%} | "
                    f"{e.within_10min:.1%} | {e.within_1h:.1%} |"
                )
        out.append("")
    out += [f"{h}# Simulator speed", "", *speed_table(runs), ""]
    bad = {n: r.invalid for n, r in runs.results.items() if r.invalid}
    if bad:
        out += [f"{h}# Impossible decisions (skipped)", ""]
        for n, msgs in bad.items():
            out.append(f"- {n}: {len(msgs)}, e.g. {msgs[0]}")
        out.append("")
    if plots:
        out += [f"{h}# Plots", ""]
        for caption, path in plots.items():
            out += [f"![{caption}]({path})", ""]
    return "\n".join(out)


def _smooth(y: np.ndarray, n: int) -> np.ndarray:
    if n <= 1 or len(y) < n:
        return y
    return np.convolve(y, np.ones(n) / n, mode="same")


def plot_wait_cdfs(runs: RunSet, path: Path) -> None:
    fig, axes = plt.subplots(1, len(SIZE_CLASSES), figsize=(4 * len(SIZE_CLASSES), 3.4), sharey=True)
    for ax, cls in zip(axes, SIZE_CLASSES, strict=True):
        for name, r in runs.results.items():
            w = np.sort([x.queued_s / HOUR for x in r.records if size_class(x.gpu_count) == cls and x.finish is not None])
            if len(w):
                ax.plot(np.maximum(w, 1e-3), np.arange(1, len(w) + 1) / len(w), label=name)
        ax.set_xscale("log")
        ax.set_title(f"{cls} GPU(s)")
        ax.set_xlabel("queueing delay (h, log)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of jobs")
    handles, labels = axes[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, fontsize=7, loc="lower right")
    fig.suptitle(f"Queueing-delay CDF by job size — {runs.title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_utilisation(runs: RunSet, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(11, 4))
    for i, (name, r) in enumerate(runs.results.items()):
        s = r.samples
        if not s.times:
            continue
        t = (np.asarray(s.times) - s.times[0]) / HOUR
        cap = np.asarray(s.capacity, dtype=float).sum(axis=1)
        used = np.asarray(s.used, dtype=float).sum(axis=1) / cap
        bound = np.minimum(np.asarray(s.capacity, dtype=float), np.asarray(s.demand, dtype=float)).sum(axis=1) / cap
        n = max(1, len(t) // 150)
        colour = f"C{i}"
        ax.plot(t, _smooth(used, n), color=colour, label=f"{name} held")
        ax.plot(t, _smooth(bound, n), color=colour, ls=":", lw=0.8, label=f"{name} bound")
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("share of fleet GPUs")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=4)
    ax.set_title(f"GPU utilisation (solid) against the demand-limited bound (dotted) — {runs.title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_tenant_shares(result: SimResult, title: str, path: Path, *, most: int = 12) -> None:
    s = result.samples
    if not s.times:
        return
    fair = fair_shares(result)
    used = np.asarray(s.tenant_used, dtype=float)
    cap = np.asarray(s.capacity, dtype=float).sum(axis=1)
    t = (np.asarray(s.times) - s.times[0]) / HOUR
    weights = np.array([x.weight for x in result.tenants])
    order = np.argsort(-fair.sum(axis=0))[:most]
    cols = 4
    rows = math.ceil(len(order) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.4 * rows), sharex=True, squeeze=False)
    n = max(1, len(t) // 150)
    for ax, i in zip(axes.flat, order, strict=False):
        ax.plot(t, _smooth(used[:, i] / cap, n), label="held")
        ax.plot(t, _smooth(fair[:, i] / cap, n), color="grey", ls="--", label="fair share (demand-capped)")
        ax.axhline(weights[i] / weights.sum(), color="black", lw=0.6, ls=":", label="weight share")
        ax.set_title(result.tenants[i].name, fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(order) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(f"{result.policy}: each tenant's share of the fleet against its entitlement — {title}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def write_report(runs: RunSet, out: Path, *, prefix: str = "") -> Path:
    """Write ``report.md`` (or ``<prefix>report.md``) and the plots into ``out``; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    plots = plot_all(runs, out, prefix=prefix)
    path = out / f"{prefix}report.md"
    path.write_text(markdown(runs, plots) + "\n")
    return path


def plot_all(runs: RunSet, out: Path, *, prefix: str = "") -> dict[str, str]:
    """Every plot of a run set, as {caption: file name relative to ``out``}."""
    plots: dict[str, str] = {}
    name = f"{prefix}wait_cdf.png"
    plot_wait_cdfs(runs, out / name)
    plots["Queueing-delay CDFs by size class"] = name
    name = f"{prefix}utilisation.png"
    plot_utilisation(runs, out / name)
    plots["Utilisation over time against the demand-limited bound"] = name
    for policy, r in runs.results.items():
        name = f"{prefix}shares_{policy}.png"
        plot_tenant_shares(r, runs.title, out / name)
        plots[f"Tenant shares against entitlement: {policy}"] = name
    return plots
