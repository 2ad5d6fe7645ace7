"""Console page of the parallel-strategy planner: plan a training run on the node pools and/or hypothetical devices
without submitting it ("what would this cost on H100 vs A100 vs a mix?").

The form posts to POST /api/v1/plans/ from the browser (frontend/static/frontend/pages/plan.js), so the page checks
and answers exactly as the API does; nothing is written or reserved.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.cluster.selectors import accelerator_type_list, node_pools_for_planning
from controlplane.planning.presets import PRESET_NAMES
from frontend.views import _base_context


@login_required
def plan_page(request):
    _, context = _base_context(request, "plan")
    # What a plan can use: the healthy, uncordoned nodes (as POST /api/v1/plans/ counts them).
    pools = [{"name": pool.name, "accelerator_type": pool.accelerator_type.slug, "simulated": pool.simulated,
              "devices": pool.ready_node_count * pool.devices_per_node, "devices_per_node": pool.devices_per_node}
             for pool in node_pools_for_planning().values() if pool.accelerator_type.slug != "cpu"]
    context.update({
        "presets": PRESET_NAMES,
        "preset": request.GET.get("model") if request.GET.get("model") in PRESET_NAMES else "llama2-7b",
        "pools": pools,
        "first_ready": next((pool["name"] for pool in pools if pool["devices"]), None),
        "accelerator_types": [t.slug for t in accelerator_type_list() if t.slug != "cpu"],
    })
    return render(request, "frontend/plan.html", context)
