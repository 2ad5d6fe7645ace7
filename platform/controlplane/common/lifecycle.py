"""Moves a stateful object (training job, deployment) through its state machine.

One function for both so every transition is checked against the table, timestamped, recorded as
an event with its reason and cause, and audited — in the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models
from django.utils import timezone

from controlplane.common.state_machine import StateMachine
from controlplane.tenancy.services import audit_event, audit_record


def transition(*, obj: models.Model, machine: StateMachine, event_model: type[models.Model], to: str,
               reason: str, actor=None, system: str | None = None, data: dict | None = None) -> models.Model:
    """Lock `obj`, move it to `to`, and append an event. Raises InvalidTransition if the table forbids it."""
    locked = _locked_with_team(obj)
    current = locked.state
    machine.check_transition(current, to)
    now = timezone.now()
    locked.state = to
    locked.state_reason = reason
    locked.state_changed_at = now
    update = ["state", "state_reason", "state_changed_at"]
    if machine.is_terminal(to) and hasattr(locked, "finished_at"):
        locked.finished_at = now
        update.append("finished_at")
    locked.save(update_fields=update)
    record_event(obj=locked, event_model=event_model, from_state=current, to_state=to, reason=reason,
                 actor=actor, system=system, data=data)
    return locked


def _locked_with_team(obj: models.Model) -> models.Model:
    """`obj`'s row, locked, with its team read in the same query (the audit record names the team: it was one more
    query per transition), where the database locks the object's row alone (FOR UPDATE OF); elsewhere its team is
    read when it is recorded, as before, rather than locked too."""
    rows = type(obj).objects
    features = connection.features
    if features.has_select_for_update and not features.has_select_for_update_of:
        return rows.select_for_update().get(pk=obj.pk)
    return rows.select_for_update(of=("self",)).select_related("team").get(pk=obj.pk)


def _team_of(obj: models.Model):
    """`obj`'s team where it is loaded already (no query for its name), else its id."""
    return obj.team if type(obj).team.is_cached(obj) else obj.team_id


def transition_many(changes: Sequence[tuple[models.Model, str, dict]], *, machine: StateMachine,
                    event_model: type[models.Model], to: str, system: str, fields: Sequence[str] = ()) -> None:
    """`transition` for many objects of one model at once, each (obj, reason, data), in a few statements: their
    state (and `fields`, already set on them) written together (common.bulk), their events and audit records
    inserted together. The caller holds their rows locked and their state fresh (the scheduling cycle loads them
    with select_for_update in its transaction): they are not read again. Raises InvalidTransition, before writing
    anything, if the table forbids one."""
    from controlplane.common.bulk import write_fields

    for obj, _, _ in changes:
        machine.check_transition(obj.state, to)
    now = timezone.now()
    terminal = machine.is_terminal(to)
    entries = []
    for obj, reason, data in changes:
        entries.append((obj, obj.state, reason, data))
        obj.state, obj.state_reason, obj.state_changed_at = to, reason, now
        if terminal and hasattr(obj, "finished_at"):
            obj.finished_at = now
    objs = [obj for obj, _, _ in changes]
    finished = ["finished_at"] if terminal and objs and hasattr(objs[0], "finished_at") else []
    write_fields(objs, ["state", "state_reason", "state_changed_at", *finished, *fields])
    _record_many(entries, event_model=event_model, system=system)


def record_events_many(entries: Sequence[tuple[models.Model, str, dict]], *, event_model: type[models.Model],
                       system: str) -> None:
    """`record_event` without a state change (e.g. a gang shrunk or grown) for many objects, each (obj, reason,
    data): their events and audit records inserted together."""
    _record_many([(obj, obj.state, reason, data) for obj, reason, data in entries], event_model=event_model,
                 system=system)


def _record_many(entries, *, event_model, system: str) -> None:
    """Events and audit records of (obj, from_state, reason, data) entries, each obj in its new state: what
    record_event writes for each, inserted together."""
    from controlplane.tenancy.models import AuditEvent, Team

    label = f"system:{system}"
    names = dict(Team.objects.filter(pk__in={obj.team_id for obj, *_ in entries}).values_list("pk", "name"))
    event_model.objects.bulk_create([
        event_model(subject=obj, from_state=current, to_state=obj.state, reason=reason, actor_label=label,
                    data=data or {})
        for obj, current, reason, data in entries], batch_size=500)
    AuditEvent.objects.bulk_create([
        audit_event(actor=None, team=obj.team_id, action=f"{obj._meta.model_name}.transition", target=obj,
                    data={"from": current, "to": obj.state, "reason": reason}, system=system,
                    team_name=names.get(obj.team_id, ""))
        for obj, current, reason, data in entries], batch_size=500)


def record_event(*, obj, event_model, from_state: str, to_state: str, reason: str, actor=None,
                 system: str | None = None, data: dict | None = None):
    label = actor.get_username() if actor is not None else f"system:{system or 'fleetyard'}"
    event = event_model.objects.create(
        subject=obj, from_state=from_state, to_state=to_state, reason=reason, actor_label=label,
        data=data or {},
    )
    audit_record(actor=actor, team=_team_of(obj), action=f"{obj._meta.model_name}.transition", target=obj,
                 data={"from": from_state, "to": to_state, "reason": reason}, system=system)
    return event


class LifecycleEvent(models.Model):
    """Abstract base of a state timeline entry; concrete models add `subject` as a foreign key."""

    from_state = models.CharField(max_length=16, blank=True)
    to_state = models.CharField(max_length=16)
    reason = models.TextField()
    actor_label = models.CharField(max_length=150)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        abstract = True
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.from_state or '-'} -> {self.to_state}: {self.reason}"
