"""`parallelism: auto` for training jobs: ask the parallel-strategy planner for each accepted
accelerator type at the job's size, keep the types that can run the model, and store the plans.

The plan sizes the gang: when the best layout of every accepted type uses fewer devices than the job
asked for (a small global batch cannot be split over more data-parallel ranks), the gang shrinks to the
workers those layouts need, so the scheduler does not hold idle devices for it (`sized_by_plan`); a layout
with tensor, pipeline or expert parallelism needs every one of its devices, so such a job is not elastic
(workers_min is raised to workers_max); an elastic data-parallel one starts no narrower than the width at
which its layout fits device memory (`min_workers_by_plan`). An elastic job is planned at workers_max, unless that
makes a fixed gang no accepted type's nodes could ever hold: then at the widest gang from workers_min one could hold
(`plan_job_gang`, noted in `sized_by_plan`). The built-in trainer (one rank per worker) takes the plan's
tensor and pipeline degrees at worker granularity where its small model can (jobs.runtime.lm_config.
trainer_layout: a tensor group inside one worker's devices stays inside that worker) and runs them with
jobs.runtime.model_parallel; otherwise it trains data parallel and logs why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from controlplane.cluster.link_defaults import one_node_link, resolve_link_bandwidth
from controlplane.cluster.models import AcceleratorType, NodePool
from controlplane.cluster.plans import (
    MAX_GLOBAL_BATCH_SIZE,
    device_type_for,
    plan_estimate,
    pool_link_refusal,
    resolve_model,
)
from controlplane.cluster.selectors import never_hold_reason
from controlplane.common.errors import ValidationFailed
from controlplane.planning import DevicePool, Layout, PlanOptions, PlanRequest, predict

PLAN_KEYS = {"mode", "model", "global_batch_size", "options"}


def _summary(best: dict, accelerator_type: str, count: int, pool: dict) -> dict:
    """What the job keeps of a plan: the figures shown, and the whole layout with the pool shape and achievable
    fraction it was planned with, so step times measured later can refine the fraction (jobs/calibration.py)."""
    layout = best["layout"]
    return {"accelerator_type": accelerator_type, "devices": count,
            "layout_devices": Layout.from_dict(layout).devices, "description": best["description"],
            "dp": layout["dp"], "tp": layout["tp"], "pp": layout["pp"], "ep": layout["ep"],
            "micro_batch_size": layout["micro_batch_size"], "recompute": layout["recompute"], "zero": layout["zero"],
            "step_time_s": best["step_time_s"], "tokens_per_s": best["tokens_per_s"], "mfu": best["mfu"],
            "memory_gb": best["memory_gb"], "memory_limit_gb": best["memory_limit_gb"],
            "cost_per_million_tokens_usd": best.get("cost_per_million_tokens_usd"), "reason": best["reason"],
            "layout": layout, "achievable_fraction": pool["achievable_fraction"],
            "pool": {key: pool[key] for key in ("devices_per_node", "intra_node_gbps", "inter_node_gbps")}}


def plan_options(options) -> dict:
    """``parallelism.options`` read exactly as POST /api/v1/plans/ reads ``options`` (its serializer: booleans as DRF
    reads them, so "no" is false; max_micro_batch 1-256; max_alternatives 0-20; no unknown keys). ValidationFailed
    (field "parallelism") naming ``options.<field>`` otherwise."""
    from controlplane.cluster.api.serializers import PlanOptionsSerializer

    data = PlanOptionsSerializer(data=options)
    if not data.is_valid():
        problems = []
        for name, messages in data.errors.items():
            where = "options" if name in ("non_field_errors", "detail") else f"options.{name}"
            if not isinstance(messages, list | tuple):
                messages = [messages]
            problems.append(f"{where}: {' '.join(str(message) for message in messages)}")
        raise ValidationFailed("; ".join(problems), field="parallelism")
    return dict(data.validated_data)


def plan_job_parallelism(*, parallelism: Mapping, accelerator_types: list[str], workers: int,
                         devices_per_worker: int) -> dict:
    """The stored plan: per accepted type the best layout for `workers` x `devices_per_worker` devices,
    and why the other types cannot run it. Raises ValidationFailed (field "parallelism") when the
    request is malformed or no accepted type can run the model."""
    unknown = sorted(set(parallelism) - PLAN_KEYS)
    if unknown:
        raise ValidationFailed(f"unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(PLAN_KEYS))}",
                               field="parallelism")
    if parallelism.get("mode", "auto") != "auto":
        raise ValidationFailed("mode: only 'auto' is supported", field="parallelism")
    if "model" not in parallelism or "global_batch_size" not in parallelism:
        raise ValidationFailed("auto needs model (a preset name or a model description) and global_batch_size",
                               field="parallelism")
    batch = parallelism["global_batch_size"]
    if isinstance(batch, float) and batch.is_integer():  # 64.0, as the endpoint's integer field takes it
        batch = int(batch)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValidationFailed("global_batch_size: must be a positive integer", field="parallelism")
    if batch > MAX_GLOBAL_BATCH_SIZE:  # the cap of POST /api/v1/plans/
        raise ValidationFailed(f"global_batch_size: must be at most {MAX_GLOBAL_BATCH_SIZE:,} sequences per step, "
                               f"got {batch:,}", field="parallelism")
    options = plan_options(parallelism.get("options", {}))
    from jobs.calibration import planner_fractions

    fractions = planner_fractions()
    count = workers * devices_per_worker
    accelerators = {a.slug: a for a in AcceleratorType.objects.filter(slug__in=list(accelerator_types))}
    by_type: dict[str, dict] = {}
    cannot: dict[str, str] = {}
    model_facts = None
    for slug in accelerator_types:
        if slug == "cpu":
            cannot[slug] = "the planner plans accelerators; CPU workers run data parallel only"
            continue
        pool = NodePool.objects.filter(accelerator_type__slug=slug).order_by("name").first()
        per_node = _planned_node_size(count, pool.devices_per_node if pool else 8, devices_per_worker)
        try:  # the chip's facts first: without them the links do not matter
            if slug in accelerators:
                device_type_for(accelerators[slug], fractions)
        except ValueError as exc:
            cannot[slug] = str(exc)
            continue
        link = pool.link_bandwidth if pool else resolve_link_bandwidth(slug)
        if workers == 1:  # one worker is one node: no traffic between nodes (as the plan endpoint; a review)
            link = one_node_link(link)
        if not link.known:  # (before: "devices[0]: ...; give intra_node_gbps and inter_node_gbps", fields a job's
            # parallelism block does not have; found by QA)
            cannot[slug] = (pool_link_refusal(pool, link) if pool else
                            f"no {slug} node pool, and no assumed link bandwidth for {slug} to plan with")
            continue
        device = {"accelerator_type": slug, "count": count, "devices_per_node": per_node,
                  "intra_node_gbps": link.intra_node_gbps, "inter_node_gbps": link.inter_node_gbps}
        within = tensor_parallel_within(workers, devices_per_worker, per_node)
        try:
            answer = plan_estimate(model=parallelism["model"], global_batch_size=batch, devices=[device],
                                   options={**options, "tensor_parallel_within": within} if within else options,
                                   fractions=fractions)
        except ValidationFailed as exc:
            if exc.field in ("model", "options", "global_batch_size"):
                raise ValidationFailed(f"{exc.field}: {exc}", field="parallelism") from exc
            # its words without the request's index: the job sent no list (before, "devices[0]: kunlun-p800: ..."; QA)
            cannot[slug] = str(exc).removeprefix("devices[0]: ")
            continue
        model_facts = answer["model"]
        if answer["feasible"]:
            by_type[slug] = _summary(answer["best"], slug, count, answer["pools"][0])
        else:
            cannot[slug] = answer["reason"]
    if not by_type:
        details = "; ".join(f"{slug}: {why}" for slug, why in cannot.items())
        raise ValidationFailed(f"no accepted accelerator type can run this model at {count} devices ({details})",
                               field="parallelism")
    # Expert parallelism is model parallelism too: each EP rank holds its share of the experts, so the layout needs its
    # devices in groups of EP (before, DP32 x EP4 left the gang elastic at 28..32 workers, where 29 run no EP4; QA).
    model_parallel = any(plan["tp"] * plan["pp"] * plan["ep"] > 1 for plan in by_type.values())
    if not model_parallel:
        spec, _preset = resolve_model(parallelism["model"])
        for slug, summary in by_type.items():
            summary["fewest_devices"] = fewest_data_parallel_devices(
                summary, spec=spec, global_batch_size=batch, accelerator=accelerators[slug],
                devices_per_worker=devices_per_worker, options=options, fractions=fractions)
    return {"mode": "auto", "model": model_facts, "global_batch_size": batch, "devices": count,
            "by_type": by_type, "cannot_run": cannot, "model_parallel": model_parallel}


def plan_job_gang(*, parallelism: Mapping, accelerator_types: list[str], workers_min: int, workers_max: int,
                  devices_per_worker: int) -> tuple[dict, list[str], int, int]:
    """(plan, the accepted types that can run it in the job's order, workers_min, workers_max) of a `parallelism:
    auto` job. It is planned at workers_max; when that plan's model-parallel layout makes an elastic job a fixed gang
    that no accepted type's nodes could ever hold (every node in service, nothing running: the dry run's "never"), it
    is planned again at the widest gang from workers_min that one of them could hold, and `sized_by_plan` says so
    (before, 1..8 workers of 8 H100 became a fixed gang of 8 on two 8-device nodes and waited for good; QA). If no
    width in range fits, or the model does not run at it, the plan at workers_max stands."""
    def planned(workers: int) -> tuple[dict, int, int]:
        plan = plan_job_parallelism(parallelism=parallelism, accelerator_types=accelerator_types, workers=workers,
                                    devices_per_worker=devices_per_worker)
        low, high = gang_size_from_plan(plan, workers_min=workers_min, workers_max=workers,
                                        devices_per_worker=devices_per_worker)
        # A gang the plan narrowed is planned again at its own width, until the plan is the narrowed gang's: its
        # devices may sit on another node shape (4 x 2 devices are one node of 8, 6 x 2 six nodes of 2), where
        # another layout is best, and the job's retry, submitted at that width, plans that one (before, 1-6 x 2 H100
        # kept DP1 x TP2 x PP4 planned on twelve devices, while its gang of 4 and its retry got DP4 x TP2; QA).
        while high < workers:
            try:
                narrower = plan_job_parallelism(parallelism=parallelism, accelerator_types=accelerator_types,
                                                workers=high, devices_per_worker=devices_per_worker)
            except ValidationFailed:  # (the model does not run at that width on this shape: keep the wider plan)
                break
            narrow_low, narrow_high = gang_size_from_plan(narrower, workers_min=workers_min, workers_max=high,
                                                          devices_per_worker=devices_per_worker)
            narrower["sized_by_plan"] = "; ".join(filter(None, [plan["sized_by_plan"],
                                                                narrower.get("sized_by_plan")]))
            plan, low, workers, high = narrower, narrow_low, high, narrow_high
        return plan, low, high

    plan, low, high = planned(workers_max)
    if workers_min < workers_max and plan["model_parallel"] and not _holders(plan, low, devices_per_worker):
        widest = max((_widest_held(slug, devices_per_worker, workers_min, low - 1) for slug in plan["by_type"]),
                     default=0)
        if widest >= workers_min:
            try:
                narrower, narrow_low, narrow_high = planned(widest)
                holders = _holders(narrower, narrow_low, devices_per_worker)
            except ValidationFailed:  # the model does not run on that few devices
                holders = []
            if holders:
                note = (f"no accepted type's nodes could ever hold {low} workers of {devices_per_worker} devices, even "
                        f"all in service with nothing running: planned at {narrow_high} workers, the most the "
                        f"{', '.join(holders)} nodes could hold")
                narrower["sized_by_plan"] = "; ".join(filter(None, [note, narrower.get("sized_by_plan")]))
                plan, low, high = narrower, narrow_low, narrow_high
    return plan, [slug for slug in accelerator_types if slug in plan["by_type"]], low, high


def _holders(plan: dict, workers: int, devices_per_worker: int) -> list[str]:
    """The planned types whose nodes could hold `workers` workers, as the dry run counts it (never_hold_reason: a type
    with no known nodes yet may get them, so it could)."""
    return [slug for slug in plan["by_type"]
            if not never_hold_reason(accelerator_type=slug, units=devices_per_worker, members=workers)]


def _widest_held(slug: str, devices_per_worker: int, lowest: int, highest: int) -> int:
    """The widest gang in lowest..highest the type's nodes could hold (never_hold_reason), 0 if none."""
    def held(workers: int) -> bool:
        return not never_hold_reason(accelerator_type=slug, units=devices_per_worker, members=workers)

    if highest < lowest or not held(lowest):
        return 0
    while lowest < highest:  # held(lowest); a gang held is held narrower too
        middle = (lowest + highest + 1) // 2
        lowest, highest = (middle, highest) if held(middle) else (lowest, middle - 1)
    return lowest


def _planned_node_size(count: int, per_node: int, devices_per_worker: int) -> int:
    """The devices per node `count` devices of a gang are planned on: the pool's, or for workers that do not fill
    whole nodes (3 x 4 devices on nodes of 8) one worker per node, as they may land on as many nodes as there are
    workers: tensor parallelism stays inside a worker (before, a 400 about devices[0])."""
    if count > per_node and count % per_node and 0 < devices_per_worker <= per_node:
        return devices_per_worker
    return per_node


def tensor_parallel_within(workers: int, devices_per_worker: int, per_node: int) -> int:
    """The devices a TP group must stay inside (PlanOptions.tensor_parallel_within; 0: a node's): a worker's when
    several workers smaller than a node may land on different nodes, so a TP degree divides a worker's devices
    (before, 2 x 4 devices were planned as TP8 on one node of 8 and the scheduler put the workers on two nodes, found
    by QA; and a cap of 6 devices let TP4 span two 6-device workers, found by a review). Their data- and
    pipeline-parallel links are still planned at the node's bandwidth: workers usually share nodes (best fit), and a
    slower link there only makes the step slower than planned, where TP across nodes is not what the plan describes
    at all."""
    if workers > 1 and 0 < devices_per_worker < per_node:
        return devices_per_worker
    return 0


def fewest_data_parallel_devices(summary: dict, *, spec, global_batch_size: int, accelerator: AcceleratorType,
                                 devices_per_worker: int, options: Mapping, fractions) -> int:
    """The fewest devices, in whole workers, on which the type's best data-parallel layout (tp = pp = 1) still fits
    device memory with fewer data-parallel ranks: an elastic job runs at any width from its minimum, and with fewer
    ranks each device holds a larger share of the optimizer state (ZeRO) and more micro-batches. At a narrower width
    the layout may use the most memory-saving settings the request's options allow (micro-batch 1, optimizer state
    and gradients sharded, full recomputation). The layout's own width when no fewer fits."""
    layout = Layout.from_dict(summary["layout"])
    per_worker = max(1, devices_per_worker)
    shape = summary["pool"]
    plan_options = PlanOptions(**dict(options))
    saving = replace(layout, micro_batch_size=1, zero=layout.zero or plan_options.allow_zero,
                     shard_gradients=layout.shard_gradients or plan_options.allow_zero,
                     recompute="full" if plan_options.allow_recompute else layout.recompute)
    device = device_type_for(accelerator, fractions)
    for devices in range(per_worker, layout.dp, per_worker):
        per_node = _planned_node_size(devices, shape["devices_per_node"], per_worker)
        nodes, per_node = (1, devices) if devices <= per_node else (devices // per_node, per_node)
        pool = DevicePool(device=device, nodes=nodes, devices_per_node=per_node,
                          intra_node_gbps=shape["intra_node_gbps"], inter_node_gbps=shape["inter_node_gbps"],
                          name=layout.stages[0].pool)
        for candidate in (layout, saving):
            # Memory only: with tp = pp = 1 it does not depend on the global batch, which need not split evenly over
            # a narrower width for this question (before, a batch of 509 made every width fail, and the job was
            # told it needed 509 devices "to fit device memory"; found by a review).
            step = devices * candidate.micro_batch_size
            batch = max(step, -(-global_batch_size // step) * step)
            request = PlanRequest(model=spec, global_batch_size=batch, pools=(pool,), options=plan_options)
            try:
                if predict(request, replace(candidate, dp=devices)).fits:
                    return devices
            except ValueError:  # this width cannot run it at all (e.g. expert parallelism does not divide it)
                continue
    return layout.dp


def gang_size_from_plan(plan: dict, *, workers_min: int, workers_max: int, devices_per_worker: int) -> tuple[int, int]:
    """(workers_min, workers_max) for the stored plan: no more workers than the largest best layout of the accepted
    types uses (noted in the plan as `sized_by_plan`), all of them for a model-parallel layout, and for a
    data-parallel one no fewer than the width at which every accepted type's layout fits device memory (before, an
    elastic job planned at 8 devices was admitted on 1, where the planner says it needs 121 GB of 80; found by QA)."""
    used = max((p.get("layout_devices") or p["devices"]) for p in plan["by_type"].values())
    per_worker = max(1, devices_per_worker)
    needed = max(1, math.ceil(used / per_worker))
    if needed < workers_max:
        plan["sized_by_plan"] = (f"the best layouts use at most {used} of the {workers_max * devices_per_worker} "
                                 f"devices asked for: the gang is {needed} x {devices_per_worker} devices")
        workers_max = needed
        workers_min = min(workers_min, needed)
    if plan["model_parallel"]:
        if workers_min < workers_max:  # (before, an elastic 1..8 became 8..8 without a word; found by QA)
            plan["min_workers_by_plan"] = (f"{_model_parallel_layouts(plan)} the model over its devices, so the gang "
                                           f"is not elastic: it starts at {workers_max} workers, not {workers_min}")
        workers_min = workers_max
    fewest = max((p.get("fewest_devices") or 0) for p in plan["by_type"].values())
    at_least = min(workers_max, math.ceil(fewest / per_worker))
    if at_least > workers_min:
        plan["min_workers_by_plan"] = (f"the best layouts need at least {fewest} devices to fit device memory: the "
                                       f"gang starts at {at_least} workers, not {workers_min}")
        workers_min = at_least
    return workers_min, workers_max


def _model_parallel_layouts(plan: dict) -> str:
    """Words like "the best layout on nvidia-h100 (DP2 x TP8 x PP4) splits", naming every accepted type whose best
    layout splits the model (tensor, pipeline or expert parallel)."""
    parts = []
    for slug, summary in plan["by_type"].items():
        if summary["tp"] * summary["pp"] * summary["ep"] > 1:
            degrees = f"DP{summary['dp']} x TP{summary['tp']} x PP{summary['pp']}"
            if summary["ep"] > 1:
                degrees += f" x EP{summary['ep']}"
            parts.append(f"{slug} ({degrees})")
    if len(parts) == 1:
        return f"the best layout on {parts[0]} splits"
    return f"the best layouts on {', '.join(parts)} split"
