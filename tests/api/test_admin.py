"""Django admin works for operators on every registered model, and is closed to everyone else."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse

from tests.api.test_isolation import beta_objects  # noqa: F401 - fixture: one of every team object


@pytest.fixture
def operator_client(world):
    ops = world["ops"]
    ops.is_superuser = True
    ops.save()
    client = Client()
    client.force_login(ops)
    return client


def test_every_model_changelist_and_change_page_renders(operator_client, beta_objects):  # noqa: F811
    for model in admin.site._registry:
        meta = model._meta
        url = reverse(f"admin:{meta.app_label}_{meta.model_name}_changelist")
        assert operator_client.get(url).status_code == 200, url
        first = model.objects.first()
        if first is not None:
            url = reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[first.pk])
            assert operator_client.get(url).status_code == 200, url


def test_admin_is_closed_to_team_members(world):
    client = Client()
    client.force_login(world["alpha"]["admin"])
    response = client.get(reverse("admin:jobs_trainingjob_changelist"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


class _AdminForm(HTMLParser):
    """The values an admin change page's form would send as it stands (inputs, checked boxes, selected options,
    textareas), to post back with a few changed."""

    def __init__(self):
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._select = self._textarea = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "input" and name and attrs.get("type") not in {"submit", "button", "file"}:
            if attrs.get("type") in {"checkbox", "radio"}:
                if "checked" in attrs:
                    self.data.setdefault(name, []).append(attrs.get("value") or "on")
            else:
                self.data.setdefault(name, []).append(attrs.get("value") or "")
        elif tag == "select" and name:
            self._select = name
            self.data.setdefault(name, [])
        elif tag == "option" and self._select and "selected" in attrs:
            self.data[self._select].append(attrs.get("value") or "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = [""]

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea][0] += data.lstrip("\n") if not self.data[self._textarea][0] else data


def _post_change(client, model, pk, expect=302, **changes):
    url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_change", args=[pk])
    parser = _AdminForm()
    parser.feed(client.get(url).content.decode())
    data = {key: values for key, values in parser.data.items() if key != "csrfmiddlewaretoken"}
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = [value]
    response = client.post(url, data)
    assert response.status_code == expect, response.content.decode()[:3000]
    return response


def test_operator_writes_in_the_admin_are_audited(operator_client, world, demo_cluster):
    """QA (2026-11-29): a priority class, a quota (inline), a cordon or a membership changed in the admin, or a
    priority class deleted there, left no audit event; the API's writes each leave one."""
    from controlplane.cluster.models import Node
    from controlplane.quotas.models import PriorityClass
    from controlplane.tenancy.models import AuditEvent, Membership

    before_id = AuditEvent.objects.latest("id").id
    _post_change(operator_client, PriorityClass, world["priority"].pk, value="900")
    event = AuditEvent.objects.latest("id")
    assert (event.action, event.actor_label, event.team_id) == ("priorityclass.admin_change", "ops", None)
    assert event.data == {"fields": {"value": 900}}

    queue = world["cluster_queue"]
    h100 = queue.quotas.get(accelerator_type__slug="nvidia-h100")
    index = list(queue.quotas.values_list("id", flat=True)).index(h100.pk)  # the inline lists them so
    _post_change(operator_client, type(queue), queue.pk, **{f"quotas-{index}-nominal_quota": "4"})
    event = AuditEvent.objects.filter(action="resourcequota.admin_change").get()
    assert event.data == {"fields": {"nominal_quota": 4.0}, "of": "shared"} and event.target_id == str(h100.pk)

    node = Node.objects.get(name="h100-pool-0")
    _post_change(operator_client, Node, node.pk, cordoned="on")
    assert Node.objects.get(pk=node.pk).cordoned
    event = AuditEvent.objects.filter(action="node.admin_change").get()
    assert event.data == {"fields": {"cordoned": True}} and event.team_id is None

    membership = Membership.objects.get(user=world["alpha"]["viewer"])
    _post_change(operator_client, Membership, membership.pk, role="member")
    event = AuditEvent.objects.filter(action="membership.admin_change").get()
    assert event.data == {"fields": {"role": "member"}} and event.team_id == world["alpha"]["team"].pk

    spare = PriorityClass.objects.create(name="spare", value=1)
    url = reverse("admin:quotas_priorityclass_delete", args=[spare.pk])
    assert operator_client.post(url, {"post": "yes"}).status_code == 302
    event = AuditEvent.objects.filter(action="priorityclass.admin_delete").get()
    assert event.target_id == str(spare.pk) and event.data == {"object": "spare (1)"}
    assert list(AuditEvent.objects.filter(id__gt=before_id).order_by("id").values_list("action", flat=True)) == [
        "priorityclass.admin_change", "resourcequota.admin_change", "node.admin_change", "membership.admin_change",
        "priorityclass.admin_delete"]


def test_cluster_queue_teams_set_in_the_admin_restrict_it(operator_client, world):
    """Review (2026-11-29): `open_to_all_teams` became a stored field set by the API's services when a queue's teams
    change; the admin's teams box did not set it, so a queue an operator gave team alpha in the admin stayed open to
    every team (before the field, naming teams there restricted the queue)."""
    from controlplane.common.errors import ValidationFailed
    from controlplane.quotas.models import ClusterQueue
    from controlplane.quotas.services import local_queue_create

    alpha, beta = world["alpha"], world["beta"]
    queue = world["cluster_queue"]
    # beta's local queue must go first (the API refuses to leave out a team whose local queues use it)
    beta["queue"].delete()
    _post_change(operator_client, ClusterQueue, queue.pk, teams=str(alpha["team"].pk))
    queue.refresh_from_db()
    assert list(queue.teams.values_list("name", flat=True)) == ["alpha"]
    assert queue.open_to_all_teams is False
    with pytest.raises(ValidationFailed):
        local_queue_create(actor=beta["admin"], team=beta["team"], name="sneak", cluster_queue=queue)

    _post_change(operator_client, ClusterQueue, queue.pk, teams=None)  # every team again
    queue.refresh_from_db()
    assert queue.open_to_all_teams is True and not queue.teams.exists()


def test_cluster_queue_added_in_the_admin_with_teams_is_restricted(operator_client, world):
    from controlplane.quotas.models import ClusterQueue

    url = reverse("admin:quotas_clusterqueue_add")
    parser = _AdminForm()
    parser.feed(operator_client.get(url).content.decode())
    data = {key: values for key, values in parser.data.items()
            if key != "csrfmiddlewaretoken" and "__prefix__" not in key}
    data.update(name=["alpha-only"], teams=[str(world["alpha"]["team"].pk)])  # the open box left as it comes
    response = operator_client.post(url, data)
    assert response.status_code == 302, response.content.decode()[:3000]
    queue = ClusterQueue.objects.get(name="alpha-only")
    assert queue.open_to_all_teams is False


def _quota_row(queue, slug):
    """The admin's inline index of the queue's quota of `slug` (the inline lists them in the model's order)."""
    return list(queue.quotas.values_list("accelerator_type__slug", flat=True)).index(slug)


def _refusal(response):
    """The queue form's field errors, the quota rows' field errors (by index) and the quota inline's own errors."""
    formset = response.context["inline_admin_formsets"][0].formset
    return (dict(response.context["adminform"].form.errors),
            {index: dict(errors) for index, errors in enumerate(formset.errors) if errors},
            list(formset.non_form_errors()))


def test_the_admin_refuses_a_borrowing_or_lending_limit_without_a_cohort(operator_client, world):
    """QA (2026-12-07): the API refuses a borrowing or lending limit on a queue in no cohort, and leaving the cohort
    while such a limit stays (tests/api/test_operator_qa.py); the admin saved both. Its quota rows now keep the same
    rule (ClusterQueue.quotas_needing_cohort): the error under the limit, and above the rows naming the cohort."""
    from controlplane.quotas.models import ClusterQueue

    queue = world["cluster_queue"]
    h100, a100 = _quota_row(queue, "nvidia-h100"), _quota_row(queue, "nvidia-a100")
    _post_change(operator_client, ClusterQueue, queue.pk, **{f"quotas-{h100}-borrowing_limit": "8"})  # in cohort all
    assert queue.quotas.get(accelerator_type__slug="nvidia-h100").borrowing_limit == 8

    # leaving the cohort while the limit stays
    refused = _post_change(operator_client, ClusterQueue, queue.pk, expect=200, cohort="")
    fields, rows, above = _refusal(refused)
    assert fields == {}
    assert list(rows) == [h100] and list(rows[h100]) == ["borrowing_limit"], rows
    assert "needs a cohort" in rows[h100]["borrowing_limit"][0]
    assert len(above) == 1 and "nvidia-h100" in above[0] and "set cohort" in above[0], above
    assert ClusterQueue.objects.get(pk=queue.pk).cohort == "all"

    # leaving it and clearing the limit in one save is fine, as the API's PATCH with quotas free of limits
    _post_change(operator_client, ClusterQueue, queue.pk, cohort="", **{f"quotas-{h100}-borrowing_limit": ""})
    queue.refresh_from_db()
    assert queue.cohort == "" and queue.quotas.get(accelerator_type__slug="nvidia-h100").borrowing_limit is None

    # a lending limit set on a queue in no cohort
    refused = _post_change(operator_client, ClusterQueue, queue.pk, expect=200,
                           **{f"quotas-{a100}-lending_limit": "4"})
    fields, rows, above = _refusal(refused)
    assert list(rows) == [a100] and list(rows[a100]) == ["lending_limit"], rows
    assert "nvidia-a100" in above[0]
    assert queue.quotas.get(accelerator_type__slug="nvidia-a100").lending_limit is None

    # a queue added in no cohort with a limit
    url = reverse("admin:quotas_clusterqueue_add")
    parser = _AdminForm()
    parser.feed(operator_client.get(url).content.decode())
    data = {key: values for key, values in parser.data.items()
            if key != "csrfmiddlewaretoken" and "__prefix__" not in key}
    h100_type = queue.quotas.get(accelerator_type__slug="nvidia-h100").accelerator_type_id
    data.update({"name": ["solo"], "quotas-TOTAL_FORMS": ["1"], "quotas-0-accelerator_type": [str(h100_type)],
                 "quotas-0-nominal_quota": ["4"], "quotas-0-borrowing_limit": ["4"]})
    refused = operator_client.post(url, data)
    assert refused.status_code == 200
    assert list(_refusal(refused)[1]) == [0] and "borrowing_limit" in _refusal(refused)[1][0]
    assert not ClusterQueue.objects.filter(name="solo").exists()
    data["cohort"] = ["pool"]
    assert operator_client.post(url, data).status_code == 302
    assert ClusterQueue.objects.get(name="solo").quotas.get().borrowing_limit == 4


def test_the_admin_keeps_the_teams_of_a_cluster_queues_local_queues(operator_client, world):
    """QA (2026-12-07): the API's PATCH refuses teams that leave out a team whose local queues use the queue (409);
    the admin saved them, and beta's queue stayed on a cluster queue closed to beta."""
    from controlplane.quotas.models import ClusterQueue

    queue = world["cluster_queue"]
    refused = _post_change(operator_client, ClusterQueue, queue.pk, expect=200, teams=str(world["alpha"]["team"].pk))
    fields = _refusal(refused)[0]
    assert list(fields) == ["teams"] and "beta/default" in fields["teams"][0], fields
    queue.refresh_from_db()
    assert not queue.teams.exists() and queue.open_to_all_teams is True


def test_the_admin_points_a_teams_local_queue_only_at_a_cluster_queue_open_to_the_team(operator_client, world):
    """QA (2026-12-07): the API refuses a local queue on a cluster queue closed to its team (400 on cluster_queue);
    the admin saved one, and the team used that queue's quota."""
    from controlplane.quotas.models import ClusterQueue, LocalQueue
    from controlplane.quotas.services import cluster_queue_create

    closed = cluster_queue_create(actor=world["ops"], name="alpha-only", teams=[world["alpha"]["team"]])
    beta_queue = world["beta"]["queue"]
    refused = _post_change(operator_client, LocalQueue, beta_queue.pk, expect=200, cluster_queue=str(closed.pk))
    errors = refused.context["adminform"].form.errors
    assert list(errors) == ["cluster_queue"] and "not open to team beta" in errors["cluster_queue"][0], errors
    assert LocalQueue.objects.get(pk=beta_queue.pk).cluster_queue.name == "shared"
    _post_change(operator_client, LocalQueue, world["alpha"]["queue"].pk, cluster_queue=str(closed.pk))
    assert LocalQueue.objects.get(pk=world["alpha"]["queue"].pk).cluster_queue == ClusterQueue.objects.get(
        name="alpha-only")


def test_the_admin_leaves_observed_node_fields_to_the_reconciler_and_keeps_pools_with_nodes(operator_client, world,
                                                                                          demo_cluster):
    """QA (2026-11-29): the node page edited free devices, capacity and health, which the reconciler owns (a wrong
    free count misled the scheduler until its next pass), and deleting a pool deleted its nodes, jobs placed on them
    included. Only `cordoned` is the operator's; a pool with nodes cannot be deleted there."""
    from controlplane.cluster.models import Node, NodePool

    node = Node.objects.get(name="h100-pool-0")
    before = (node.free_devices, node.capacity_devices, node.health)
    _post_change(operator_client, Node, node.pk, cordoned="on", free_devices="0", capacity_devices="64",
                 health="down")
    node.refresh_from_db()
    assert node.cordoned and (node.free_devices, node.capacity_devices, node.health) == before
    assert operator_client.get(reverse("admin:cluster_node_add")).status_code == 403
    pool = NodePool.objects.get(name="h100-pool")
    response = operator_client.post(reverse("admin:cluster_nodepool_delete", args=[pool.pk]), {"post": "yes"})
    assert response.status_code == 403 and Node.objects.filter(pool=pool).exists()


def test_the_admin_audit_log_shows_and_finds_a_deleted_teams_events_by_name(operator_client, world):
    from controlplane.tenancy.models import Team

    Team.objects.filter(name="beta").delete()
    found = operator_client.get(reverse("admin:tenancy_auditevent_changelist"), {"q": "beta", "action": "team.create"})
    rows = found.context["cl"].result_list
    assert [(event.action, event.team_name) for event in rows] == [("team.create", "beta")]
    assert '<td class="field-team_name">beta</td>' in found.content.decode()
