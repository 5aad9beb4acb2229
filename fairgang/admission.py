"""Admission (SPEC R1.2, R2.1): may this tenant run this job on this fleet?

Pure: every admission rule is here, each taking what it decides on and returning every problem.
:func:`check_admission` judges a job spec against the tenant's policy and the fleet's node shapes
(``POST /v1/jobs`` and each sweep trial), :func:`check_sweep_admission` every distinct trial of a
sweep the same way, and :func:`job_cap_problem` the tenant's concurrent-job cap (decided inside
the store's insert transaction, from the count it reads there).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fairgang.durations import format_duration
from fairgang.spec import JobSpec, SpecProblem

if TYPE_CHECKING:
    from fairgang.sweeps import SweepSpec

#: At most this many distinct problems are gathered from a sweep's trials.
SWEEP_PROBLEM_LIMIT = 20


@dataclass(frozen=True)
class TenantPolicy:
    name: str
    allowed_gpu_types: frozenset[str]
    max_gpus_per_job: int
    max_runtime_s: float
    checkpoint_prefix: str | None
    #: Glob patterns of the images its jobs may name (``local``: the process runtime); None: any.
    allowed_images: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FleetShape:
    """GPU type -> {GPUs per node: number of nodes}, and the topology levels in use."""

    shapes: dict[str, dict[int, int]]
    levels: frozenset[str]


def checkpoint_prefix(tenant: str, configured: str | None) -> str:
    """Where the tenant's checkpoints must lie: its configured prefix, else ``/checkpoints/<tenant>``."""
    return (configured or f"/checkpoints/{tenant}").rstrip("/") or "/"


def gang_fits_shape(count: int, shapes: dict[int, int]) -> bool:
    """Can ``count`` GPUs ever be placed: on one node, or on whole nodes of one shape?"""
    if any(count <= per_node for per_node in shapes):
        return True
    return any(count % per_node == 0 and count // per_node <= nodes for per_node, nodes in shapes.items())


def gang_shape_problem(count: int, gpu_type: str, shapes: dict[int, int]) -> str:
    """Why ``count`` GPUs can never be placed (``gang_fits_shape`` is false): more than the fleet has, or not
    whole nodes of one size."""
    total = sum(per_node * nodes for per_node, nodes in shapes.items())
    desc = ", ".join(f"{n} node(s) of {g}" for g, n in sorted(shapes.items()))
    if count > total:
        return f"{count} {gpu_type} GPUs is more than the fleet has: {total} in all ({desc})"
    sizes = ", ".join(f"a multiple of {g} up to {g * n}" for g, n in sorted(shapes.items()))
    return f"{count} {gpu_type} GPUs is not whole nodes: a job larger than one node takes whole nodes of one size ({sizes}; {desc})"


def check_admission(spec: JobSpec, tenant: TenantPolicy, fleet: FleetShape) -> list[SpecProblem]:
    """Every reason this tenant may not submit this job; empty when admitted."""
    problems: list[SpecProblem] = []
    shapes = fleet.shapes.get(spec.gpu_type)
    if shapes is None:
        known = ", ".join(sorted(fleet.shapes)) or "none"
        problems.append(SpecProblem(field="gpu_type", reason=f"unknown GPU type '{spec.gpu_type}' (the fleet has: {known})"))
    elif tenant.allowed_gpu_types and spec.gpu_type not in tenant.allowed_gpu_types:
        allowed = ", ".join(sorted(tenant.allowed_gpu_types))
        problems.append(SpecProblem(field="gpu_type", reason=f"tenant '{tenant.name}' may not use {spec.gpu_type} (allowed: {allowed})"))
    if shapes is not None:
        problems += _gpu_count_problems(spec, shapes)
    if spec.max_gpus > tenant.max_gpus_per_job:
        problems.append(
            SpecProblem(
                field=_count_field(spec, "max"),
                reason=f"{spec.max_gpus} is over tenant '{tenant.name}' limit of {tenant.max_gpus_per_job} GPUs per job",
            )
        )
    if spec.max_runtime > tenant.max_runtime_s:
        problems.append(
            SpecProblem(
                field="max_runtime",
                reason=f"{format_duration(spec.max_runtime)} is over tenant '{tenant.name}' limit of "
                f"{format_duration(tenant.max_runtime_s)}",
            )
        )
    if tenant.allowed_images is not None and not any(fnmatch.fnmatchcase(spec.image, p) for p in tenant.allowed_images):
        allowed = ", ".join(tenant.allowed_images) or "none"
        problems.append(SpecProblem(field="image", reason=f"'{spec.image}' is not among tenant '{tenant.name}' allowed images ({allowed})"))
    prefix = checkpoint_prefix(tenant.name, tenant.checkpoint_prefix)
    if not (spec.checkpoint_dir == prefix.rstrip("/") or spec.checkpoint_dir.startswith(prefix.rstrip("/") + "/")):
        problems.append(SpecProblem(field="checkpoint_dir", reason=f"must lie under the tenant's prefix {prefix}"))
    if spec.topology.level != "any" and spec.topology.level not in fleet.levels:
        levels = ", ".join(sorted(fleet.levels | {"any"}))
        problems.append(SpecProblem(field="topology.level", reason=f"unknown topology level '{spec.topology.level}' (one of {levels})"))
    return problems


def _count_field(spec: JobSpec, bound: str) -> str:
    """The field a GPU-count problem names: ``gpu_count``, or ``gpu_count.min`` / ``gpu_count.max`` of a range."""
    return "gpu_count" if isinstance(spec.gpu_count, int) else f"gpu_count.{bound}"


def _gpu_count_problems(spec: JobSpec, shapes: dict[int, int]) -> list[SpecProblem]:
    """Whether the job's GPU count (each end of an elastic range) can ever be placed, in steps the shape allows."""
    largest = max(shapes)
    on_one_node = spec.topology.level == "node" and spec.topology.mode == "required"
    for bound, count in (("min", spec.min_gpus), ("max", spec.max_gpus)):
        if not gang_fits_shape(count, shapes):
            return [SpecProblem(field=_count_field(spec, bound), reason=gang_shape_problem(count, spec.gpu_type, shapes))]
        if on_one_node and count > largest:
            return [SpecProblem(field="topology.level", reason=f"{count} GPUs do not fit on one node (at most {largest})")]
    if spec.elastic and spec.max_gpus > largest:
        # Spanning nodes, it grows and shrinks by whole nodes of one size: both ends must be whole nodes of it.
        sizes = [g for g in sorted(shapes) if spec.min_gpus % g == 0 and spec.max_gpus % g == 0 and spec.max_gpus // g <= shapes[g]]
        if not sizes:
            return [
                SpecProblem(
                    field="gpu_count.min",
                    reason=f"an elastic job larger than one node grows and shrinks by whole nodes: min ({spec.min_gpus}) and "
                    f"max ({spec.max_gpus}) must both be multiples of one {spec.gpu_type} node size "
                    f"({', '.join(str(g) for g in sorted(shapes))})",
                )
            ]
    return []


def check_sweep_admission(spec: SweepSpec, tenant: TenantPolicy, fleet: FleetShape) -> list[SpecProblem]:
    """Admission problems of every distinct trial job of a sweep (fields relative to the job spec).

    Each trial's job spec is judged by :func:`check_admission`; gathering stops once
    :data:`SWEEP_PROBLEM_LIMIT` distinct problems are found.
    """
    seen: dict[tuple[str, str], SpecProblem] = {}
    for index, params in enumerate(spec.trial_params()):
        for problem in check_admission(spec.trial_spec(index, params, tenant=tenant.name), tenant, fleet):
            seen.setdefault((problem.field, problem.reason), problem)
        if len(seen) >= SWEEP_PROBLEM_LIMIT:
            break
    return list(seen.values())


def job_cap_problem(tenant: str, unfinished: int, max_concurrent_jobs: int | None) -> SpecProblem | None:
    """Why one more job would put the tenant over its concurrent-job cap (None: it may submit; no cap: None)."""
    if max_concurrent_jobs is None or unfinished < max_concurrent_jobs:
        return None
    return SpecProblem(field="tenant", reason=f"tenant '{tenant}' already has {unfinished} unfinished jobs (limit {max_concurrent_jobs})")
