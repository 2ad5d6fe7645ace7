"""Plan a training run without submitting it: "what would this cost on H100 vs A100 vs a mix?".

``plan_estimate`` turns node pools (from the database) and hypothetical devices into the planner core's
inputs (``controlplane.planning``), runs the search, and prices the answer from the accelerator types'
``price_per_hour_usd``. It only reads: nothing is written, queued or reserved.

The helpers ``device_type_for`` and ``device_pool_for`` are the one place that maps database rows to
planner dataclasses, so that anything else that plans (a job with ``parallelism: auto``) sees the same
figures as this endpoint.

``fractions`` (from ``jobs.calibration.planner_fractions``) carries per accelerator type the achievable
fraction of peak refined from step times measured on real hardware, with a note saying so; without it the
published calibration or the default applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from decimal import Decimal

from controlplane.cluster import selectors
from controlplane.cluster.link_defaults import LinkBandwidth, one_node_link, resolve_link_bandwidth
from controlplane.cluster.models import AcceleratorType, NodePool
from controlplane.common.errors import ValidationFailed
from controlplane.planning import (
    CALIBRATED_ACHIEVABLE_FRACTION,
    DevicePool,
    DeviceType,
    ModelSpec,
    PlanOptions,
    PlanRequest,
    PlanResult,
    device_type_from_facts,
    plan,
)
from controlplane.planning.presets import model_spec

# The mixed-chip search tries every order of the pools in a pipeline and every TP and stage count per pool,
# so its cost grows steeply with the number of pools. Measured on the development machine: H100 + A100
# pools of 16 to 16,384 devices each took 0.1-1.4 s for every preset; 3 pools took 12 s (GPT-3 175B,
# 3 x 128 devices) and 41 s (3 x 512), too long for a request. Beyond 2, a request turns the mixed search
# off (each pool is then searched on its own, which is linear in the pools).
MAX_POOLS_MIXED = 2
MAX_POOLS = 4
MAX_DEVICES = 32768
# Sequences per optimizer step, on every path that plans (POST /api/v1/plans/ and a job's parallelism: auto): the
# search tries every divisor of it as the data-parallel size, and 10**13 took 11 s.
MAX_GLOBAL_BATCH_SIZE = 10_000_000


@dataclass(frozen=True)
class _Entry:
    """One pool of the request as the planner sees it, with what the answer reports about it."""

    pool: DevicePool
    source: str  # "node-pool" or "hypothetical"
    accelerator: AcceleratorType
    link: LinkBandwidth
    simulated: bool | None
    fraction_note: str = ""  # where the achievable fraction comes from, when measured runs refined it

    def as_dict(self) -> dict:
        price = self.accelerator.price_per_hour_usd
        return {
            "name": self.pool.name, "source": self.source, "accelerator_type": self.accelerator.slug,
            "nodes": self.pool.nodes, "devices_per_node": self.pool.devices_per_node, "devices": self.pool.devices,
            "intra_node_gbps": self.pool.intra_node_gbps, "inter_node_gbps": self.pool.inter_node_gbps,
            "link_bandwidth_assumed": self.link.assumed, "link_bandwidth_note": self.link.note,
            "price_per_hour_usd": float(price) if price is not None else None,
            "achievable_fraction": self.pool.device.achievable_fraction,
            "achievable_fraction_source": self.fraction_note or _fraction_source(self.pool.device),
            "simulated": self.simulated,
        }


# -- database rows -> planner inputs ------------------------------------------------------------------------


# {accelerator type slug: (achievable fraction, where it comes from)}: measured refinements.
Fractions = Mapping[str, tuple[float, str]]


def device_type_for(accelerator: AcceleratorType, fractions: Fractions | None = None) -> DeviceType:
    """The planner's view of an accelerator type. ValueError naming the missing figure when the type lacks
    published TFLOPS, memory or memory bandwidth (the planner never invents one). ``fractions`` replaces
    the calibrated or default achievable fraction with a measured one."""
    refined = (fractions or {}).get(accelerator.slug)
    return device_type_from_facts({
        "slug": accelerator.slug, "bf16_dense_tflops": accelerator.bf16_dense_tflops,
        "fp8_dense_tflops": accelerator.fp8_dense_tflops, "memory_gb": accelerator.memory_gb,
        "memory_bandwidth_gbps": accelerator.memory_bandwidth_gbps,
    }, achievable_fraction=refined[0] if refined else None)


def _fraction_source(device: DeviceType) -> str:
    if device.slug in CALIBRATED_ACHIEVABLE_FRACTION:
        return f"calibrated on published {device.slug} training runs"
    return f"assumed (no measured step times for {device.slug} yet)"


def _shape(devices: int, per_node: int) -> tuple[int, int]:
    """(nodes, devices per node) for ``devices`` devices on nodes of ``per_node``: whole nodes, or part of one."""
    if devices <= per_node:
        return 1, devices
    if devices % per_node:
        raise ValueError(f"{devices} devices is neither whole nodes of {per_node} nor at most one node")
    return devices // per_node, per_node


def pool_link_refusal(pool: NodePool, link: LinkBandwidth | None = None) -> str:
    """Why `pool` cannot be planned on for want of link figures (its `link_bandwidth`, or `link`), or "": the one
    wording of the plan endpoint, a job's plan and the Planner page."""
    link = link or pool.link_bandwidth
    if link.known:
        return ""
    return (f"node pool {pool.name!r} has no link bandwidth to plan with ({link.note}); an operator sets "
            "intra_node_gbps and inter_node_gbps on the pool")


def pool_link(pool: NodePool, *, one_node: bool = False) -> LinkBandwidth:
    """`pool`'s link figures as a plan uses them: planned on one node that talks to no other, a missing inter-node
    figure is not needed (as for one hypothetical device entry, or a job of one worker; before, a one-node L40S pool
    alone in a request was refused for want of it, while 8 hypothetical L40S planned; found by QA)."""
    return one_node_link(pool.link_bandwidth) if one_node else pool.link_bandwidth


def device_pool_for(pool: NodePool, *, nodes: int, devices: int | None = None,
                    fractions: Fractions | None = None, alone: bool = False) -> DevicePool:
    """``pool`` as a planner pool of ``nodes`` nodes, or of its first ``devices`` devices. ValueError when
    the accelerator type or the link bandwidths are unknown, or ``devices`` is not whole nodes. ``alone``: the
    request's only pool or device entry; planned on one node, it needs no inter-node figure."""
    device = device_type_for(pool.accelerator_type, fractions)
    per_node = pool.devices_per_node
    if not per_node:
        raise ValueError(f"node pool {pool.name!r} has no accelerator devices per node")
    available = nodes * per_node
    if devices is None:
        devices = available
    elif devices > available:
        raise ValueError(f"node pool {pool.name!r} has {available} devices on {nodes} ready node(s), "
                         f"{devices} were asked for")
    nodes, per_node = _shape(devices, per_node)
    link = pool_link(pool, one_node=alone and nodes == 1)
    if not link.known:
        raise ValueError(pool_link_refusal(pool, link))
    return DevicePool(device=device, nodes=nodes, devices_per_node=per_node, intra_node_gbps=link.intra_node_gbps,
                      inter_node_gbps=link.inter_node_gbps, name=pool.name)


def resolve_model(model) -> tuple[ModelSpec, str | None]:
    """(the model, its preset name or None) from a preset name, a preset with overrides, or a description.
    ValidationFailed (field "model") when it is malformed."""
    try:
        if isinstance(model, str):
            return model_spec(model), model
        if not isinstance(model, Mapping):  # (it said "model must be an object", though a name is one; QA)
            raise ValueError(f"give a preset name or an object of model fields, got {type(model).__name__}")
        if "preset" in model:
            preset = model["preset"]
            if not isinstance(preset, str):
                raise ValueError(f"preset must be a string, got {preset!r}")
            return model_spec(preset, {k: v for k, v in model.items() if k != "preset"}), preset
        return ModelSpec.from_dict(model), None
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(str(exc), field="model") from exc


def _node_pool_entries(pools: Sequence[Mapping], taken: set[str], fractions: Fractions,
                       alone: bool = False) -> list[_Entry]:
    """`alone`: the request's only pool or device entry (then one node of it talks to no other node)."""
    names = [item["pool"] for item in pools]
    found = selectors.node_pools_for_planning(names=names)
    entries = []
    for index, item in enumerate(pools):
        name = item["pool"]
        where = f"pools[{index}]"
        pool = found.get(name)
        if pool is None:
            raise ValidationFailed(f"{where}: unknown node pool {name!r}", field="pools")
        if name in taken:
            raise ValidationFailed(f"{where}: node pool {name!r} is listed twice", field="pools")
        if not pool.ready_node_count:
            raise ValidationFailed(f"{where}: node pool {name!r} has no healthy, uncordoned nodes to plan on; "
                                   f"ask about hypothetical devices instead", field="pools")
        try:
            device_pool = device_pool_for(pool, nodes=pool.ready_node_count, devices=item.get("devices"),
                                          fractions=fractions, alone=alone)
        except ValueError as exc:
            raise ValidationFailed(f"{where}: {exc}", field="pools") from exc
        taken.add(name)
        link = pool_link(pool, one_node=alone and device_pool.nodes == 1)
        entries.append(_Entry(device_pool, "node-pool", pool.accelerator_type, link, pool.simulated,
                              _fraction_note(pool.accelerator_type.slug, fractions)))
    return entries


def _fraction_note(slug: str, fractions: Fractions) -> str:
    return fractions[slug][1] if slug in fractions else ""


def _hypothetical_entries(devices: Sequence[Mapping], taken: set[str], fractions: Fractions,
                          alone: bool = False) -> list[_Entry]:
    """`alone`: the request's only pool or device entry (then one node of it talks to no other node)."""
    types = {a.slug: a for a in selectors.accelerator_type_list().filter(
        slug__in=[item["accelerator_type"] for item in devices])}
    entries = []
    for index, item in enumerate(devices):
        where = f"devices[{index}]"
        slug = item["accelerator_type"]
        accelerator = types.get(slug)
        if accelerator is None:  # (the names it could be: a typo sent through the SDK got no hint; a review)
            known = ", ".join(sorted(a.slug for a in selectors.accelerator_type_list() if a.slug != "cpu"))
            raise ValidationFailed(f"{where}: unknown accelerator type {slug!r}; known: {known}", field="devices")
        try:
            device = device_type_for(accelerator, fractions)
            nodes, per_node = _shape(item["count"], item.get("devices_per_node") or 8)
        except ValueError as exc:
            raise ValidationFailed(f"{where}: {exc}", field="devices") from exc
        link = resolve_link_bandwidth(slug, item.get("intra_node_gbps"), item.get("inter_node_gbps"),
                                      given_by="the request")
        if alone and nodes == 1:
            # one node alone: no traffic between nodes, so no figure is needed for it (before, one node of 8 L40S
            # with intra_node_gbps given was refused for lack of inter_node_gbps; found by QA). Beside another entry
            # a pipeline may cross to the other's node (a review found the shortcut taken there too).
            link = one_node_link(link)
        if not link.known:
            raise ValidationFailed(f"{where}: {link.note}; give intra_node_gbps and inter_node_gbps",
                                   field="devices")
        name = _free_name(slug, index, taken)
        pool = DevicePool(device=device, nodes=nodes, devices_per_node=per_node, intra_node_gbps=link.intra_node_gbps,
                          inter_node_gbps=link.inter_node_gbps, name=name)
        taken.add(name)
        entries.append(_Entry(pool, "hypothetical", accelerator, link, None, _fraction_note(slug, fractions)))
    return entries


def _free_name(slug: str, index: int, taken: set[str]) -> str:
    """A name for hypothetical device group ``index`` of type ``slug`` that no node pool or earlier group of the
    request has: the slug, else ``slug-index``, else ``slug-index+1``, ... (a node pool may be named
    "nvidia-h100-1")."""
    if slug not in taken:
        return slug
    suffix = index
    while f"{slug}-{suffix}" in taken:
        suffix += 1
    return f"{slug}-{suffix}"


# -- pricing and comparison ---------------------------------------------------------------------------------


def _priced(prediction: dict, entries: dict[str, _Entry]) -> dict:
    """The prediction with the price of the devices its layout uses (None when any price is unknown)."""
    used = prediction["layout"]["devices_by_pool"]
    unpriced = sorted({entries[name].accelerator.slug for name in used
                       if entries[name].accelerator.price_per_hour_usd is None})
    per_hour = per_million = None
    if not unpriced:
        total = sum((Decimal(count) * entries[name].accelerator.price_per_hour_usd for name, count in used.items()),
                    Decimal(0))
        per_hour = round(float(total), 4)
        if prediction["tokens_per_s"] > 0:
            per_million = round(float(total) / (prediction["tokens_per_s"] * 3600) * 1e6, 4)
    return {**prediction, "cost_per_hour_usd": per_hour, "cost_per_million_tokens_usd": per_million,
            "unpriced_accelerator_types": unpriced}


def _result(result: PlanResult, entries: dict[str, _Entry]) -> dict:
    data = result.as_dict()
    data["best"] = _priced(data["best"], entries) if data["best"] else None
    data["alternatives"] = [_priced(p, entries) for p in data["alternatives"]]
    return data


def _ratio(value, reference) -> float | None:
    if value is None or reference is None or reference <= 0:
        return None
    return round(value / reference, 4)


def _compare(mixed: dict, request: PlanRequest, entries: dict[str, _Entry]) -> dict:
    """Each accelerator type's pools planned alone, beside the plan over all of them."""
    by_type: dict[str, list[DevicePool]] = {}
    for pool in request.pools:
        by_type.setdefault(entries[pool.name].accelerator.slug, []).append(pool)
    rows = []
    for slug, pools in sorted(by_type.items()):
        if len(by_type) == 1:
            alone = mixed
        else:
            single = replace(request, pools=tuple(pools), options=replace(request.options, max_alternatives=0))
            alone = _result(plan(single), entries)
        best, mixed_best = alone["best"], mixed["best"]
        rows.append({
            "accelerator_type": slug, "pools": [p.name for p in pools], "devices": sum(p.devices for p in pools),
            "feasible": alone["feasible"], "reason": alone["reason"], "best": best,
            "step_time_ratio_to_mix": _ratio(best and best["step_time_s"], mixed_best and mixed_best["step_time_s"]),
            "cost_per_million_tokens_ratio_to_mix": _ratio(best and best["cost_per_million_tokens_usd"],
                                                           mixed_best and mixed_best["cost_per_million_tokens_usd"]),
        })
    feasible = [row for row in rows if row["best"]]
    fastest = min(feasible, key=lambda row: row["best"]["step_time_s"], default=None)
    priced = [row for row in feasible if row["best"]["cost_per_million_tokens_usd"] is not None]
    cheapest = min(priced, key=lambda row: row["best"]["cost_per_million_tokens_usd"], default=None)
    return {
        "by_type": rows,
        "fastest_single_type": fastest["accelerator_type"] if fastest else None,
        "cheapest_single_type": cheapest["accelerator_type"] if cheapest else None,
        "mix_speedup_over_fastest_single_type": _ratio(fastest and fastest["best"]["step_time_s"],
                                                       mixed["best"] and mixed["best"]["step_time_s"]),
    }


def _assumptions(entries: Sequence[_Entry]) -> list[str]:
    notes = []
    for entry in entries:
        device = entry.pool.device
        if entry.link.assumed:
            notes.append(f"{entry.pool.name}: {entry.link.note}")
        if entry.fraction_note:
            notes.append(f"{entry.pool.name}: matrix multiplies reach {device.achievable_fraction:g} of the "
                         f"dense peak, {entry.fraction_note}")
        elif device.slug in CALIBRATED_ACHIEVABLE_FRACTION:
            notes.append(f"{entry.pool.name}: matrix multiplies reach {device.achievable_fraction:g} of the "
                         f"dense peak, calibrated on published {device.slug} training runs")
        else:
            notes.append(f"{entry.pool.name}: matrix multiplies assumed to reach {device.achievable_fraction:g} "
                         f"of the dense peak (no measured step times for {device.slug} yet)")
        if entry.accelerator.price_per_hour_usd is None:
            notes.append(f"{entry.pool.name}: no known price for {entry.accelerator.slug}; its costs are null")
    return list(dict.fromkeys(notes))


# -- the entry point --------------------------------------------------------------------------------------


def plan_estimate(*, model: str | Mapping, global_batch_size: int, pools: Sequence[Mapping] = (),
                  devices: Sequence[Mapping] = (), options: Mapping | None = None, compare: bool = False,
                  fractions: Fractions | None = None) -> dict:
    """Plan ``model`` at ``global_batch_size`` sequences per step on node pools (``{"pool", "devices"?}``)
    and/or hypothetical devices (``{"accelerator_type", "count", "devices_per_node"?, "intra_node_gbps"?,
    "inter_node_gbps"?}``). Malformed input raises ValidationFailed naming the field; a request nothing can
    run is an answer (``feasible: false`` and the reason). With ``compare``, each accelerator type is also
    planned alone, and the answer gives the ratios to the mix. ``fractions``: measured achievable fractions
    per accelerator type (``jobs.calibration.planner_fractions``)."""
    spec, preset = resolve_model(model)
    try:
        plan_options = PlanOptions(**dict(options or {}))
    except (TypeError, ValueError) as exc:
        raise ValidationFailed(str(exc), field="options") from exc
    if not pools and not devices:
        raise ValidationFailed("name node pools (pools) or hypothetical devices (devices) to plan on", field="pools")
    limit = MAX_POOLS_MIXED if plan_options.allow_heterogeneous else MAX_POOLS
    if len(pools) + len(devices) > limit:
        raise ValidationFailed(f"at most {limit} pools and device groups in all"
                               + (" when mixing chips (options.allow_heterogeneous)"
                                  if plan_options.allow_heterogeneous else ""), field="pools" if pools else "devices")
    taken: set[str] = set()
    fractions = fractions or {}
    entries = (_node_pool_entries(pools, taken, fractions, alone=len(pools) == 1 and not devices)
               + _hypothetical_entries(devices, taken, fractions, alone=len(devices) == 1 and not pools))
    total = sum(entry.pool.devices for entry in entries)
    if total > MAX_DEVICES:
        raise ValidationFailed(f"{total} devices in all; the planner answers for at most {MAX_DEVICES}",
                               field="devices" if devices else "pools")
    try:
        request = PlanRequest(model=spec, global_batch_size=global_batch_size,
                              pools=tuple(entry.pool for entry in entries), options=plan_options)
    except ValueError as exc:
        # Only the batch is the caller's to get wrong here (pool names are made unique above); anything else is
        # filed under the pools it is about, not under global_batch_size.
        field = "global_batch_size" if str(exc).startswith("global_batch_size") else ("pools" if pools else "devices")
        raise ValidationFailed(str(exc), field=field) from exc
    by_name = {entry.pool.name: entry for entry in entries}
    answer = _result(plan(request), by_name)
    return {
        # kv_heads and ffn_hidden as resolved (0 in a ModelSpec means "same as heads" / "4 x hidden").
        "model": {"preset": preset, **asdict(spec), "kv_heads": spec.kv, "ffn_hidden": spec.ffn,
                  "parameters": spec.parameters(), "active_parameters": spec.active_parameters()},
        "global_batch_size": global_batch_size,
        "pools": [entry.as_dict() for entry in entries],
        **answer,
        "assumptions": _assumptions(entries),
        "compare": _compare(answer, request, by_name) if compare else None,
    }

