"""Small display helpers for the console templates. Nothing here marks text safe: output is escaped."""

from __future__ import annotations

import json

from django import template

register = template.Library()

# Badge tone per state or health word: one colour per meaning, shared by jobs, deployments and nodes.
STATE_TONES = {
    "PENDING": "neutral",
    "QUEUED": "info",
    "ADMITTED": "info",
    "STARTING": "info",
    "DEPLOYING": "info",
    "UPDATING": "info",
    "RUNNING": "ok",
    "SERVING": "ok",
    "SUCCEEDED": "done",
    "RECOVERING": "warn",
    "PREEMPTED": "warn",
    "DEGRADED": "warn",
    "FAILED": "bad",
    "CANCELLED": "muted",
    "DELETED": "muted",
    "HEALTHY": "ok",
    "UNREACHABLE": "bad",
}


@register.filter
def state_tone(value) -> str:
    """The badge tone (a CSS class suffix) for a job/deployment state or a node health."""
    return STATE_TONES.get(str(value).upper(), "neutral")


@register.filter
def pretty_json(value) -> str:
    """Indented JSON for dicts and lists (escaped by the template like any other text)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=False)


@register.filter
def get_item(mapping, key):
    """mapping[key], or None: for dicts keyed by something a template cannot spell."""
    try:
        return mapping.get(key)
    except AttributeError:
        return None


@register.filter
def percent(value, digits: int = 2) -> str:
    """0.99512 -> "99.51%"; None -> "—"."""
    if value is None:
        return "—"
    return f"{float(value) * 100:.{int(digits)}f}%"


@register.filter
def team_reason(obj) -> str:
    """The reason of a job, a deployment or one of their events as its team reads it: other teams' workloads are not
    named by id (jobs.selectors.reason_shown_for_team), as in the API."""
    from jobs.selectors import reason_shown_for_team

    subject = getattr(obj, "subject", None)
    team_id = subject.team_id if subject is not None else getattr(obj, "team_id", None)
    text = obj.reason if subject is not None else getattr(obj, "state_reason", "")
    return reason_shown_for_team(text=text or "", team_id=team_id)


@register.filter
def team_data(event) -> dict:
    """An event's data as its team reads it: the preemptor (`for`) and the victims (`waits_for`) are null where they
    are another team's workloads (jobs.selectors.event_data_shown_for_team), as in the API's events."""
    from jobs.selectors import event_data_shown_for_team

    return event_data_shown_for_team(data=event.data, team_id=event.subject.team_id)
