"""QA of YAML specs through POST /api/v1/specs/apply/ (and the parser the CLI shares): every mistake is a 400 naming
the line, the field and the reason, and nothing is written."""
from __future__ import annotations

import pytest
import yaml
from django.test import TestCase

from controlplane.tenancy.models import AuditEvent
from fleetyard.errors import SpecError
from fleetyard.spec import parse_spec
from jobs.models import TrainingJob

JOB = """\
name: qa
queue: default
resources:
  accelerators: H100:8
hyperparameters: {steps: 100}
"""
SERVICE = """\
kind: service
name: qa-svc
queue: default
resources:
  accelerators: A100:1
service:
  model: file:///m
  sla: {ttft_p95: 500ms, tpot_p95: 50ms}
"""


def apply(client, spec: str, *, dry_run: bool, secrets: dict | None = None):
    body = {"spec": spec} if secrets is None else {"spec": spec, "secrets": secrets}
    with TestCase.captureOnCommitCallbacks(execute=True):
        return client.post(f"/api/v1/specs/apply/?dry_run={int(dry_run)}", body, format="json")


def assert_refused_at(response, line: int, field: str, says: str) -> None:
    assert response.status_code == 400, response.json()
    body = response.json()
    assert any(issue["line"] == line and issue["field"] == field and says in issue["reason"]
               for issue in body["errors"]), body
    assert any(message.startswith(f"spec.yaml:{line}: {field}: ") for message in body["spec"]), body


@pytest.mark.parametrize(("extra", "line", "field", "says"), [
    ("dataset: dataset://nope@1\n", 6, "dataset", "not found"),
    ("dataset: nope\n", 6, "dataset", "not found"),
    ("datasets: [dataset://nope@1]\n", 6, "datasets[0]", "not found"),
    ("datasets:\n  /data: dataset://nope@1\n", 7, "datasets./data", "not found"),
    ("dataset: dataset://theirs@1\n", 6, "dataset", "not found"),  # another team's dataset
    ("secrets: [HF_TOKEN]\n", 6, "secrets", "no value sent for HF_TOKEN"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_server_side_spec_errors_name_the_line(api, demo_cluster, extra, line, field, says, dry_run):
    """Found by QA: a dataset the team does not have (or another team's) and a secret without a value were refused
    as `spec.yaml: dataset: ...` with `"line": null`, while every other mistake, the server's included (an unknown
    queue, a priority class, a checkpoint's job), named its line."""
    beta = api("beta", "member")
    theirs = beta.post("/api/v1/datasets/", {"name": "theirs"}, format="json").json()
    assert beta.post(f"/api/v1/datasets/{theirs['id']}/versions/", {"uri": "s3://b/k"},
                     format="json").status_code == 201
    client = api("alpha", "member")
    audit = AuditEvent.objects.count()
    response = apply(client, JOB + extra, dry_run=dry_run)
    assert_refused_at(response, line, field, says)
    assert not TrainingJob.objects.exists() and AuditEvent.objects.count() == audit


def test_a_worker_over_the_device_limit_names_the_accelerators_line(api, demo_cluster, settings):
    settings.FLEETYARD_MAX_DEVICES_PER_WORKER = 4
    response = apply(api("alpha", "member"), JOB, dry_run=True)
    assert_refused_at(response, 4, "resources.accelerators", "over the limit of 4")


@pytest.mark.parametrize(("text", "secrets", "line", "field", "says"), [
    (JOB, None, 1, "workers", "over the limit of 4 per job"),
    ("# a job\n" + JOB, None, 2, "workers", "over the limit of 4 per job"),
    (JOB.replace("H100:8", "H100:2"), {"HF": "x"}, 1, "secrets", "HF not named under secrets"),
    (SERVICE, None, 6, "service.replicas", "replicas"),  # (the serializer or the limit check says why)
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_an_error_about_a_field_the_spec_left_out_names_it_at_the_mapping_that_would_hold_it(
        api, demo_cluster, settings, text, secrets, line, field, says, dry_run):
    """Found by QA: a refusal of a default the spec left out (one worker, one replica, no secrets) was reported as
    `spec.yaml: num_nodes: ...` with `"line": null` (a field the spec never mentions) or without a line."""
    settings.FLEETYARD_MAX_DEVICES_PER_JOB = 4
    settings.FLEETYARD_MAX_REPLICAS_PER_DEPLOYMENT = 0
    response = apply(api("alpha", "member"), text, dry_run=dry_run, secrets=secrets)
    assert_refused_at(response, line, field, says)
    assert "num_nodes" not in str(response.json())
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("text", [
    JOB + "workers: {min: 1, max: 2}\nenvs: {A: b}\nsecrets: [HF]\ndataset: dataset://x@1\n"
          "checkpoint: {interval_steps: 10}\nretry: {max_restarts: 2}\nmax_duration: 2h\npriority: standard\n",
    JOB.replace("hyperparameters: {steps: 100}\n", "trainer: entrypoint\nworkdir: /w\nrun: python t.py\n"
                "resources2: x\n").replace("resources2: x\n", "datasets: [dataset://x@1]\n"),
    SERVICE + "  replicas: {min: 1, max: 2}\n  router: pow2\n  engine: {slots: 2}\n",
    SERVICE.replace("model: file:///m", "checkpoint: job:3"),
])
def test_every_field_a_spec_sends_points_back_at_a_line(text):
    """What the server refuses is reported at the spec line the field came from (Spec.locate): every field of the
    create body the spec wrote must have one, or its error is reported without a line (only a default the spec left
    out, such as workers or envs, has none)."""
    spec = parse_spec(text)
    written = set(yaml.safe_load(text))
    unplaced = {name: spec.locate(name) for name in spec.body
                if spec.locate(name)[1] is None and (name not in spec.origins or spec.locate(name)[0] in written)}
    assert not unplaced, unplaced


@pytest.mark.parametrize("kind", ["[job]", "{job: 1}", "[]", "{}", "7", "null_", "Dataset"])
def test_a_kind_that_is_not_job_or_deployment_is_refused_at_its_line(api, demo_cluster, kind):
    """Found by QA: `kind: [job]` or `kind: {job: 1}` was a TypeError (unhashable type) in the parser: a 500 from the
    API and a traceback from the CLI."""
    client = api("alpha", "member")
    for dry_run in (True, False):
        response = apply(client, f"kind: {kind}\n" + JOB, dry_run=dry_run)
        assert_refused_at(response, 1, "kind", "expected job or deployment")
    assert not TrainingJob.objects.exists()


def _laughs(levels: int) -> list[str]:
    """`a: &a [x, ...]`, `b: &b [*a, ...]`, ...: each line nine times the one before."""
    names = "abcdefghij"
    return ["a: &a [x, x, x, x, x, x, x, x, x]"] + [
        f"{names[i + 1]}: &{names[i + 1]} [{', '.join([f'*{names[i]}'] * 9)}]" for i in range(levels - 1)]


def test_a_yaml_alias_bomb_is_refused_at_once_at_its_line(api, demo_cluster):
    """Found by QA: the parser walked every use of an alias, so eight short lines of `b: &b [*a, *a, ...]` (43 million
    values) held a web worker for minutes (133 s of CPU) and gigabytes of memory; now more than 4000 values (as many
    as the spec may have lines) is a 400 at the line whose value grows past them."""
    text = "\n".join(JOB.splitlines() + _laughs(7)) + "\n"
    client = api("alpha", "member")
    for dry_run in (True, False):
        response = apply(client, text, dry_run=dry_run)
        assert_refused_at(response, 9, "d", "more than 4000 values (an alias counts each time it is used)")
    assert not TrainingJob.objects.exists()
    # anchors and aliases within the bound are still read
    spec = parse_spec(JOB + "envs: &e {A: '1'}\ndatasets: [&d dataset://x@1]\n")
    assert spec.body["envs"] == {"A": "1"} and spec.body["dataset"] == "dataset://x@1"


def test_a_key_that_aliases_a_huge_tree_is_refused_in_a_short_message():
    """A key is built, not walked: `? [&a [x, ...], &b [*a, ...], ...]` is millions of items shared by reference,
    which the message wrote out whole (tens of megabytes of text)."""
    names = "abcdefgh"
    key = "? [&a [x, x, x, x, x, x, x, x, x], " + ", ".join(
        f"&{names[i + 1]} [{', '.join([f'*{names[i]}'] * 9)}]" for i in range(6)) + "]\n: 1\n"
    with pytest.raises(SpecError) as error:
        parse_spec(JOB + key)
    [issue] = [issue for issue in error.value.issues if "keys must be strings" in issue.reason]
    assert issue.line == 6 and len(issue.reason) < 300, len(issue.reason)


def test_a_checkpoint_policy_takes_what_the_api_takes(api, demo_cluster):
    """Found by QA: the spec allowed `checkpoint.interval_steps` only up to 4096 (its bound for worker counts) while
    the platform takes up to 1,000,000,000, so a job checkpointing every 5000 steps could be submitted through the
    REST API but not through a spec (the CLI or specs/apply)."""
    client = api("alpha", "member")
    response = apply(client, JOB + "checkpoint: {interval_steps: 5000, keep_last: 1000}\n", dry_run=False)
    assert response.status_code == 201, response.json()
    job = TrainingJob.objects.get()
    assert (job.checkpoint_interval_steps, job.checkpoint_keep_last) == (5000, 1000)
    from fleetyard.spec import CHECKPOINT_BOUNDS  # the SDK's copy of the platform's bounds
    from jobs.api.serializers import CheckpointPolicySerializer
    from jobs.models import MAX_CHECKPOINT_INTERVAL_STEPS

    platform = {"interval_steps": MAX_CHECKPOINT_INTERVAL_STEPS,
                "keep_last": CheckpointPolicySerializer().fields["keep_last"].max_value}
    assert platform == CHECKPOINT_BOUNDS
    for policy, field in (("{interval_steps: 1000000001}", "checkpoint.interval_steps"),
                          ("{keep_last: 1001}", "checkpoint.keep_last"), ("{interval_steps: 0}",
                                                                          "checkpoint.interval_steps")):
        refused = apply(client, JOB.replace("name: qa", "name: qa2") + f"checkpoint: {policy}\n", dry_run=True)
        assert_refused_at(refused, 6, field, "must be a whole number from 1 to")


@pytest.mark.parametrize(("body", "line", "byte"), [
    (JOB.replace("name: qa", "name: qa\ndescription: caf\xe9").encode("latin-1"), 2, "0xe9"),
    (JOB.encode("utf-16"), 1, "0xff"),  # with its byte order mark, FF FE
])
def test_a_yaml_body_that_is_not_utf8_is_refused_at_its_line(api, demo_cluster, body, line, byte):
    """Found by QA: the YAML body was decoded with U+FFFD for each bad byte, so a Latin-1 or UTF-16 spec got
    "name: must be lowercase ..., got '\\ufffd\\ufffd'" or "queue: required" instead of what the CLI says of the
    same file: the line and the byte that is not UTF-8."""
    client = api("alpha", "member")
    for dry_run in (1, 0):
        with TestCase.captureOnCommitCallbacks(execute=True):
            response = client.generic("POST", f"/api/v1/specs/apply/?dry_run={dry_run}", body,
                                      content_type="application/yaml")
        assert response.status_code == 400, response.json()
        [issue] = response.json()["errors"]
        assert issue["line"] == line and f"not UTF-8 text (a spec is a YAML file); byte {byte}" in issue["reason"]
        assert response.json()["spec"] == [f"spec.yaml:{line}: {issue['reason']}"]
    assert not TrainingJob.objects.exists()
    ok = client.generic("POST", "/api/v1/specs/apply/?dry_run=1", ("\ufeff" + JOB).encode(),
                        content_type="text/yaml")
    assert ok.status_code == 200, ok.json()  # UTF-8, with a byte order mark or not, is read


@pytest.mark.parametrize(("body", "content_type"), [
    (b"", "application/yaml"), (b"", "text/yaml"), (b"  \n\n", "application/yaml"),
    (b'{"spec": ""}', "application/json"), (b'{"spec": " \\n"}', "application/json"), (b"{}", "application/json"),
    (b"", "application/json"),
])
@pytest.mark.parametrize("dry_run", [True, False])
def test_an_empty_spec_is_refused_in_the_shape_of_every_spec_error(api, demo_cluster, body, content_type, dry_run):
    """Found by QA: an empty body or an empty `spec` was DRF's `{"spec": ["This field is required."]}` (or "may not be
    blank"), without the `errors` list every other spec mistake has."""
    response = api("alpha", "member").post(f"/api/v1/specs/apply/?dry_run={int(dry_run)}", data=body,
                                           content_type=content_type)
    assert response.status_code == 400, response.content
    reason = "the spec is empty: write a YAML mapping (name: ..., queue: ..., resources: ...)"
    assert response.json() == {"spec": [f"spec.yaml: {reason}"],
                               "errors": [{"line": None, "field": "", "reason": reason}]}
    assert not TrainingJob.objects.exists()


def test_a_filename_without_a_spec_is_refused_as_an_empty_spec_of_that_file(api, demo_cluster):
    """`{"filename": "train.yaml"}` with no `spec` still answered DRF's `{"spec": ["This field is required."]}`,
    without the `errors` list (noticed at stop 30)."""
    response = api("alpha", "member").post("/api/v1/specs/apply/", data={"filename": "train.yaml"},
                                           content_type="application/json")
    assert response.status_code == 400, response.content
    reason = "the spec is empty: write a YAML mapping (name: ..., queue: ..., resources: ...)"
    assert response.json() == {"spec": [f"train.yaml: {reason}"],
                               "errors": [{"line": None, "field": "", "reason": reason}]}
    assert not TrainingJob.objects.exists()
