"""The console's Planner page through Django's test client: it lists the presets, the accelerator pools (SIMULATED
ones labelled, the CPU pool left out) and the accelerator types for hypothetical devices, and needs a login."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.api.conftest import small_cluster


@pytest.fixture
def cluster(world, accel):
    small_cluster(world, accel, h100_free_on_first=4)


def test_the_planner_page_offers_presets_pools_and_types(world, cluster):
    client = Client()
    client.force_login(world["alpha"]["member"])
    response = client.get("/plan/?model=llama3-70b")
    assert response.status_code == 200
    html = response.content.decode()
    assert '<option value="llama3-70b" selected>' in html and '<option value="custom">' in html
    assert 'data-plan-pool="h100-pool"' in html and "16 devices on healthy, uncordoned nodes, 8 per node" in html
    assert 'data-plan-pool="cpu-pool"' not in html  # the planner plans accelerators
    pool_line = html.split('data-plan-pool="h100-pool"')[1].split("</label>")[0]
    assert "SIMULATED" in pool_line
    assert '<option value="nvidia-a100">nvidia-a100</option>' in html
    assert 'href="/plan/" class="active" aria-current="page">Planner</a>' in html


def test_an_unknown_preset_in_the_query_falls_back_to_the_default(world, cluster):
    client = Client()
    client.force_login(world["alpha"]["member"])
    html = client.get("/plan/?model=<script>").content.decode()
    assert '<option value="llama2-7b" selected>' in html and "<script>" not in html


def test_the_planner_page_needs_a_login():
    response = Client().get("/plan/")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_the_page_counts_only_the_nodes_a_plan_can_use(world, cluster):
    """A review found the page counting cordoned nodes (16 devices offered, 8 planned on)."""
    from controlplane.cluster.models import Node

    Node.objects.filter(name="h100-pool-1").update(cordoned=True)
    client = Client()
    client.force_login(world["alpha"]["member"])
    html = client.get("/plan/").content.decode()
    assert "8 devices on healthy, uncordoned nodes" in html
    Node.objects.filter(name="h100-pool-0").update(cordoned=True)
    html = client.get("/plan/").content.decode()
    line = html.split('data-plan-pool="h100-pool"')[1].split("</label>")[0]
    assert " disabled" in line and " checked" not in line and "no healthy, uncordoned node to plan on" in line


def test_types_the_planner_cannot_model_are_not_offered_and_their_pools_say_why(world, cluster, accel):
    """QA (2026-11-28): the page offered kunlun-p800 and ascend-910b (and the p800 pool), which every plan refuses
    ("no published bf16_dense_tflops")."""
    from controlplane.cluster.services import node_pool_create

    node_pool_create(actor=world["ops"], name="p800-pool", accelerator_type=accel["kunlun-p800"], devices_per_node=8,
                     simulated=True)
    client = Client()
    client.force_login(world["alpha"]["member"])
    html = client.get("/plan/").content.decode()
    assert '<option value="kunlun-p800">' not in html and '<option value="ascend-910b">' not in html
    assert '<option value="nvidia-h100">nvidia-h100</option>' in html
    note = html.split('id="not-plannable"')[1].split("</p>")[0]
    assert "kunlun-p800: no published bf16_dense_tflops" in note and "ascend-910b: " in note, note
    assert "kunlun-p800 (kunlun-p800" not in note  # said once (a review)
    line = html.split('data-plan-pool="p800-pool"')[1].split("</label>")[0]
    assert " disabled" in line and " checked" not in line and line.count("the planner cannot model it") == 1, line
    assert 'id="nothing-plannable"' not in html


def test_the_page_says_so_when_no_type_can_be_planned(world, cluster):
    """A review: with no type the planner can model, the page showed device rows offering only "—" and an active
    Plan button."""
    from controlplane.cluster.models import AcceleratorType

    AcceleratorType.objects.exclude(slug="cpu").update(bf16_dense_tflops=None)
    client = Client()
    client.force_login(world["alpha"]["member"])
    html = client.get("/plan/").content.decode()
    assert 'id="nothing-plannable"' in html and "data-plan-device-type" not in html
    assert 'data-busy="Planning…" disabled>Plan</button>' in html


def test_an_l40s_pool_without_links_says_the_operators_fix_and_rows_say_one_node_at_most(world, cluster, accel):
    """QA: the page offered nvidia-l40s rows on which every multi-node plan failed (no assumed bandwidth between
    nodes, and the page has no bandwidth inputs), and an L40S pool with no link figures looked plannable."""
    from controlplane.cluster.services import node_pool_create

    node_pool_create(actor=world["ops"], name="l40s-pool", accelerator_type=accel["nvidia-l40s"], devices_per_node=8,
                     simulated=True)
    client = Client()
    client.force_login(world["alpha"]["member"])
    html = client.get("/plan/").content.decode()
    assert "At most one node (nvidia-l40s): no assumed bandwidth between nodes" in html
    line = html.split('data-plan-pool="l40s-pool"')[1].split("</label>")[0]
    assert " disabled" in line and "an operator sets intra_node_gbps and inter_node_gbps on the pool" in line, line


def test_a_one_node_pool_without_an_inter_node_figure_is_offered_to_plan_alone(world, cluster, accel):
    """QA (2026-11-29): the API plans a one-node L40S pool alone (one node talks to no other), but the page kept its
    checkbox disabled for want of the figure between nodes."""
    from controlplane.cluster.models import Node
    from controlplane.cluster.services import node_pool_create

    pool = node_pool_create(actor=world["ops"], name="l40s-pool", accelerator_type=accel["nvidia-l40s"],
                            devices_per_node=8, simulated=True)
    Node.objects.create(pool=pool, name="l40s-0", capacity_devices=8, free_devices=8)
    client = Client()
    client.force_login(world["alpha"]["member"])
    line = client.get("/plan/").content.decode().split('data-plan-pool="l40s-pool"')[1].split("</label>")[0]
    assert " disabled" not in line and "one node with no known bandwidth to other nodes: plan it alone" in line, line
    Node.objects.create(pool=pool, name="l40s-1", capacity_devices=8, free_devices=8)  # two nodes: a figure is needed
    line = client.get("/plan/").content.decode().split('data-plan-pool="l40s-pool"')[1].split("</label>")[0]
    assert " disabled" in line and "an operator sets intra_node_gbps and inter_node_gbps on the pool" in line, line
