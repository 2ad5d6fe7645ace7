"""Step times measured on real hardware refine the planner's achievable fraction per chip (issue 9).

A training job planned with ``parallelism: auto`` keeps its layout and the pool shape it was planned for
(``jobs/planning.py``). Once such a job has run its own program (``trainer: entrypoint``: the program the
plan describes) on nodes that are not simulated, the median of its measured step times gives the fraction
of the dense peak at which the cost model predicts that step time (``controlplane.planning.calibration``);
the fits of the latest runs per chip, blended with the published calibration or the default, are what the
planner uses from then on (``POST /api/v1/plans/`` and ``parallelism: auto``), with a note saying so.

Left out, each with the reason in ``skipped``: the built-in trainer (it trains the small built-in LM, not the
model the plan describes), runs on simulated chips (their step times are the host CPU's), runs that ran at another
width than the plan's layout (an elastic job at its minimum runs fewer data-parallel ranks than planned), runs with
too few steps, and fits the model cannot explain. A read-only selector: nothing is written.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from controlplane.cluster.models import AcceleratorType, Node, NodePool
from controlplane.cluster.plans import device_type_for, resolve_model
from controlplane.common.errors import ValidationFailed
from controlplane.planning import DevicePool, Layout, PlanRequest
from controlplane.planning.calibration import fit_fraction, refine_fraction
from jobs.models import Trainer, TrainingJob, TrainingMetric

WARMUP_STEPS = 3  # the first steps of an attempt include start-up, compilation and the first data loads
MIN_STEPS = 5  # step-time rows (after warm-up) a run needs to count
MAX_RUNS_PER_TYPE = 20  # the latest runs per chip; older ones stop counting
MAX_JOBS_READ = 500


@dataclass
class MeasuredFraction:
    accelerator_type: str
    prior: float
    fraction: float
    runs: list[dict] = field(default_factory=list)  # {"job", "median_step_s", "predicted_at_prior_s", "fitted"}
    skipped: list[dict] = field(default_factory=list)  # {"job", "why"}

    @property
    def note(self) -> str:
        return (f"refined from the step times of {len(self.runs)} real {self.accelerator_type} run(s) "
                f"(jobs {', '.join(str(r['job']) for r in self.runs)}; prior {self.prior:g})")


def _accelerator_type(job: TrainingJob) -> str | None:
    by_type = (job.parallel_plan or {}).get("by_type") or {}
    if job.admitted_accelerator_type in by_type:
        return job.admitted_accelerator_type
    return next(iter(by_type)) if len(by_type) == 1 else None


def ran_on_simulated(job: TrainingJob, slug: str, simulated_nodes: dict[str, bool], simulated_types: set[str]) -> bool:
    """Whether the run may have been on simulated chips: any of its nodes is, or (nodes unknown) any pool of
    its type is."""
    names = set(job.observed_nodes or []) | {w.get("node") for w in job.placement or [] if isinstance(w, dict)}
    names.discard(None)
    if names:
        return any(simulated_nodes.get(name, True) for name in names)
    return slug in simulated_types


def simulation_flags() -> tuple[dict[str, bool], set[str]]:
    """{node name: simulated} and the accelerator types that have a simulated pool, as ran_on_simulated reads them."""
    nodes = dict(Node.objects.values_list("name", "simulated"))
    types = set(NodePool.objects.filter(simulated=True).values_list("accelerator_type__slug", flat=True))
    return nodes, types


def widths_ran(job: TrainingJob) -> set[int]:
    """The numbers of workers the job was admitted, resized or re-placed to (its events' `workers`)."""
    return {data["workers"] for data in job.events.values_list("data", flat=True)
            if isinstance(data, dict) and type(data.get("workers")) is int}


def median_step_time(job: TrainingJob) -> tuple[float | None, int]:
    times = [t for t in TrainingMetric.objects.filter(job=job, step__gte=WARMUP_STEPS, step_time_s__gt=0)
             .order_by("-id").values_list("step_time_s", flat=True)[:2000]]
    return (statistics.median(times) if times else None), len(times)


def _request(job: TrainingJob, plan: dict, accelerator: AcceleratorType) -> tuple[PlanRequest, Layout]:
    spec, _preset = resolve_model(job.parallelism["model"])
    shape = plan["pool"]
    devices, per_node = plan["devices"], shape["devices_per_node"]
    nodes, per_node = (1, devices) if devices <= per_node else (devices // per_node, per_node)
    pool = DevicePool(device=device_type_for(accelerator), nodes=nodes, devices_per_node=per_node,
                      intra_node_gbps=shape["intra_node_gbps"], inter_node_gbps=shape["inter_node_gbps"],
                      name=accelerator.slug)
    request = PlanRequest(model=spec, global_batch_size=job.parallel_plan["global_batch_size"], pools=(pool,))
    return request, Layout.from_dict(plan["layout"])


def measured_fractions() -> dict[str, MeasuredFraction]:
    """Per accelerator type with at least one usable real run: the refined fraction and the runs behind it;
    types whose runs were all skipped appear with the prior and the reasons."""
    accelerators = {a.slug: a for a in AcceleratorType.objects.all()}
    simulated_nodes, simulated_types = simulation_flags()
    found: dict[str, MeasuredFraction] = {}
    jobs = (TrainingJob.objects.filter(trainer=Trainer.ENTRYPOINT).exclude(parallel_plan={})
            .order_by("-id")[:MAX_JOBS_READ])
    for job in jobs:
        slug = _accelerator_type(job)
        plan = (job.parallel_plan.get("by_type") or {}).get(slug) if slug else None
        if slug not in accelerators or not plan:
            continue
        try:
            prior = device_type_for(accelerators[slug]).achievable_fraction
        except ValueError:
            continue
        entry = found.setdefault(slug, MeasuredFraction(slug, prior, prior))
        if len(entry.runs) >= MAX_RUNS_PER_TYPE:
            continue
        if "layout" not in plan or "pool" not in plan:
            entry.skipped.append({"job": job.pk, "why": "planned before plans kept their layout"})
            continue
        if ran_on_simulated(job, slug, simulated_nodes, simulated_types):
            entry.skipped.append({"job": job.pk, "why": "ran on simulated chips (host CPU step times)"})
            continue
        # the gang the plan sized: its layout's devices in whole workers (a layout need not fill the last one)
        planned = -(-(plan.get("layout_devices") or plan["devices"]) // max(1, job.devices_per_worker))
        other = sorted(w for w in widths_ran(job) if w != planned)
        if other:  # (before, an elastic job at its minimum was fitted against its wider layout; found by QA)
            entry.skipped.append({"job": job.pk, "why": f"ran on {', '.join(map(str, other))} worker(s) at times, "
                                                        f"not the {planned} its plan's layout is sized for"})
            continue
        median, rows = median_step_time(job)
        if median is None or rows < MIN_STEPS:
            entry.skipped.append({"job": job.pk, "why": f"{rows} step time(s) after warm-up; {MIN_STEPS} needed"})
            continue
        try:
            request, layout = _request(job, plan, accelerators[slug])
            fit = fit_fraction(request, layout, slug, median)
        except (KeyError, TypeError, ValueError, ValidationFailed) as exc:
            entry.skipped.append({"job": job.pk, "why": f"the stored plan cannot be evaluated: {exc}"})
            continue
        if fit.bound:
            entry.skipped.append({"job": job.pk, "why": fit.bound})
            continue
        entry.runs.append({"job": job.pk, "median_step_s": round(median, 6), "step_rows": rows,
                           "predicted_at_prior_s": round(fit.predicted_at_prior_s, 6), "fitted": fit.fraction})
    for entry in found.values():
        entry.fraction = refine_fraction(entry.prior, [run["fitted"] for run in entry.runs])
    return found


def planner_fractions() -> dict[str, tuple[float, str]]:
    """{slug: (fraction, note)} for the types real runs refined, as ``plan_estimate(fractions=...)`` takes."""
    return {slug: (entry.fraction, entry.note) for slug, entry in measured_fractions().items() if entry.runs}
