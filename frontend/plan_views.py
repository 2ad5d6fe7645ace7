"""Console page of the parallel-strategy planner: plan a training run on the node pools and/or hypothetical devices
without submitting it ("what would this cost on H100 vs A100 vs a mix?").

The form posts to POST /api/v1/plans/ from the browser (frontend/static/frontend/pages/plan.js), so the page checks
and answers exactly as the API does; nothing is written or reserved.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.cluster.link_defaults import resolve_link_bandwidth
from controlplane.cluster.plans import device_type_for, pool_link, pool_link_refusal
from controlplane.cluster.selectors import accelerator_type_list, node_pools_for_planning
from controlplane.planning.presets import PRESET_NAMES
from frontend.views import _base_context


@login_required
def plan_page(request):
    _, context = _base_context(request, "plan")
    # Types the planner cannot model (no published dense TFLOPS, memory or bandwidth) are not offered: every plan on
    # them is refused (before, the page offered them; found by QA). Their pools are shown, disabled, saying why.
    types = [t for t in accelerator_type_list() if t.slug != "cpu"]
    missing = {t.slug: _missing_facts(t) for t in types}
    # What a plan can use: the healthy, uncordoned nodes (as POST /api/v1/plans/ counts them).
    # A pool of one node needs no figure between nodes when planned alone (as the API plans it; QA).
    pools = [{"name": pool.name, "accelerator_type": pool.accelerator_type.slug, "simulated": pool.simulated,
              "devices": pool.ready_node_count * pool.devices_per_node, "devices_per_node": pool.devices_per_node,
              "not_plannable": (missing[pool.accelerator_type.slug] if pool.accelerator_type.slug in missing
                                else _missing_facts(pool.accelerator_type))
              or pool_link_refusal(pool, pool_link(pool, one_node=pool.ready_node_count == 1)),
              "alone_only": bool(pool_link_refusal(pool))}
             for pool in node_pools_for_planning().values() if pool.accelerator_type.slug != "cpu"]
    # The device rows have no bandwidth inputs: a type with no assumed link figures cannot be planned there (every
    # plan on it was refused; found by QA). The API takes them.
    one_node = []
    for accelerator in types:
        link = resolve_link_bandwidth(accelerator.slug)
        if missing[accelerator.slug] or link.known:
            continue
        if link.intra_node_gbps is None:
            missing[accelerator.slug] = (f"{accelerator.slug}: no assumed link bandwidth (plan it on a node pool an "
                                         "operator gave intra_node_gbps and inter_node_gbps, or through the API with "
                                         "them)")
        else:  # one node needs no figure between nodes
            one_node.append(accelerator.slug)
    context.update({
        "presets": PRESET_NAMES,
        "preset": request.GET.get("model") if request.GET.get("model") in PRESET_NAMES else "llama2-7b",
        "pools": pools,
        "first_ready": next((pool["name"] for pool in pools if pool["devices"] and not pool["not_plannable"]), None),
        "accelerator_types": [t.slug for t in types if not missing[t.slug]],
        "not_plannable": sorted((slug, why) for slug, why in missing.items() if why),
        "one_node_only": one_node,
    })
    return render(request, "frontend/plan.html", context)


def _missing_facts(accelerator) -> str:
    """Why the planner cannot model the type (device_type_for's reason), or ""."""
    try:
        device_type_for(accelerator)
    except ValueError as exc:
        return str(exc)
    return ""
