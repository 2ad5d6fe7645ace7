"""Data migrations, run backwards and forwards on the test database."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = ("quotas", "0003_cluster_queue_teams")


@pytest.fixture(autouse=True)
def _back_to_the_latest_schema():
    """Each test migrates an app back and forth: leave the database at every app's latest migration, as the tests
    after it (on the same worker) expect (review: a later migration that changes a column would be missing)."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())
AFTER = ("quotas", "0004_cluster_queue_open_to_all_teams")


@pytest.mark.django_db(transaction=True)
def test_cluster_queues_that_named_teams_are_restricted_after_the_open_flag_arrives():
    """Before 0004 a queue naming teams took only theirs and one naming none every team's: the new flag keeps that."""
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    old = executor.loader.project_state([BEFORE]).apps
    team = old.get_model("tenancy", "Team").objects.create(name="gamma")
    queue_model = old.get_model("quotas", "ClusterQueue")
    queue_model.objects.create(name="gamma-only").teams.add(team)
    queue_model.objects.create(name="everyone")

    executor = MigrationExecutor(connection)
    executor.migrate([AFTER])
    new = executor.loader.project_state([AFTER]).apps.get_model("quotas", "ClusterQueue")
    assert dict(new.objects.values_list("name", "open_to_all_teams")) == {"gamma-only": False, "everyone": True}


@pytest.mark.django_db(transaction=True)
def test_audit_events_recorded_before_the_name_field_keep_their_teams_name():
    before, after = ("tenancy", "0002_login_throttle"), ("tenancy", "0003_audit_event_outlives_team")
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    old = executor.loader.project_state([before]).apps
    team = old.get_model("tenancy", "Team").objects.create(name="gamma")
    event_model = old.get_model("tenancy", "AuditEvent")
    event_model.objects.create(team=team, actor_label="x", action="team.create", target_type="t", target_id="1")
    event_model.objects.create(actor_label="x", action="node.cordon", target_type="t", target_id="2")

    executor = MigrationExecutor(connection)
    executor.migrate([after])
    new = executor.loader.project_state([after]).apps.get_model("tenancy", "AuditEvent")
    assert dict(new.objects.values_list("action", "team_name")) == {"team.create": "gamma", "node.cordon": ""}


@pytest.mark.django_db(transaction=True)
def test_the_database_is_back_at_the_latest_schema_after_these_tests():
    executor = MigrationExecutor(connection)
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []
