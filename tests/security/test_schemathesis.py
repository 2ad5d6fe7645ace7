"""S7 (issue 8): schemathesis against the OpenAPI schema the API serves, in-process and with a team token.

The schema is loaded from the Django WSGI application itself (`/api/v1/schema/`), so this runs in the normal
suite on SQLite and on PostgreSQL without a server. The caller is team beta's admin with a Bearer API token;
beta has quota, a dataset with a version, a training job, a deployment, and the demo cluster's pools and nodes.

- `test_every_operation_conforms`: every operation of the schema, with positive (schema-valid) and negative
  (schema-violating) data; operations with path parameters are called on beta's real objects and on
  generated ids. Checks: not_a_server_error, status_code_conformance, content_type_conformance,
  response_schema_conformance and negative_data_rejection.
- `test_stateful_sequences_conform`: schemathesis' state machine over the links its dependency analysis infers
  from the schema (drf-spectacular declares none): a list's or a create's `id`/`name` fed to the object's paths
  (list -> get -> cancel -> retry -> delete ...), with the same checks plus use_after_free and
  ensure_resource_availability.
- `test_findings_stay_fixed`: every bug these found, as one fixed request each.

Every distinct failure is collected (not just the first), printed, and fails the test. Each call runs in a
savepoint that is rolled back, and each stateful scenario in one, so every example sees the same world (a
generated DELETE of the caller's own token or membership cannot lock out later examples or scenarios).

Bounded on purpose, not excluded: `follow=true` on a job's logs and metrics streams NDJSON until the job ends
or `timeout` seconds pass (300 by default); a call that asks for a stream in range is sent with `timeout=1`
(schema-violating timeouts are sent as generated, to be refused). The NDJSON stream is checked against its
documented schema (the array of its lines). SSE exists only in the OpenAI-compatible gateway (/v1/), which is
not in this schema. Dataset uploads (multipart with a file) are sent like any other body.
Not run: positive_data_acceptance (many schema-valid bodies are refused with 400 on purpose: a queue or
dataset that does not exist, quota rules), and schemathesis' authorization checks (S1 and S3 cover them).
"""

from __future__ import annotations

import json
import traceback
from collections import defaultdict

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.generation import GenerationMode
from schemathesis.openapi.checks import UseAfterFree
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ensure_resource_availability,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
    use_after_free,
)

from controlplane.cluster.models import Node, NodePool
from controlplane.tenancy.services import api_token_create
from inference.models import Deployment
from inference.states import DeploymentState
from jobs.models import TrainingJob, TrainingLogLine, TrainingMetric
from jobs.services import training_job_cancel, training_job_create
from tests.conftest import DEPLOYMENT_BODY, JOB_BODY

API = "/api/v1/"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]


def use_after_free_but_deployments_stay_as_history(ctx, response, case):
    """schemathesis' use_after_free, except for what the design says on purpose: DELETE on a deployment moves it
    to DELETED, the terminal state of its state machine, and it stays readable as history (events, revisions,
    metrics) while its name is free again. A read after DELETE passes only if the deployment is DELETED."""
    try:
        return use_after_free(ctx, response, case)
    except UseAfterFree:
        deployment_id = (case.path_parameters or {}).get("id")
        if case.path.startswith(f"{API}deployments/") and Deployment.objects.filter(
                pk=deployment_id, state=DeploymentState.DELETED).exists():
            return None
        raise


STATEFUL_CHECKS = [*CHECKS, use_after_free_but_deployments_stay_as_history, ensure_resource_availability]
# Examples per operation and mode on beta's real objects, and with generated path ids (mostly 404s).
EXAMPLES = 5
GENERATED_ID_EXAMPLES = 2
# A schema-valid body that the platform also accepts, per create/update operation: generated bodies name queues,
# datasets, users and pools that do not exist, so without these the 2xx answers of writes would go unchecked.
# Query and path parameters are still generated (positive and negative).
KNOWN_GOOD_BODIES = {
    "POST /api/v1/datasets/": [({"name": "corpus-new", "description": "made by schemathesis"}, "application/json")],
    "PATCH /api/v1/memberships/{id}/": [({"role": "viewer"}, "application/json")],
    "POST /api/v1/training-jobs/": [(JOB_BODY, "application/json")],
    "POST /api/v1/deployments/": [(DEPLOYMENT_BODY, "application/json")],
    "PATCH /api/v1/deployments/{id}/": [({"replicas_max": 2}, "application/json")],
    "POST /api/v1/deployments/{id}/scale/": [({"replicas_min": 1, "replicas_max": 2}, "application/json")],
    "POST /api/v1/datasets/{id}/versions/": [({"uri": "s3://bucket/corpus/v2/", "format": "jsonl"}, "application/json"),
                                             ({"file": b"one line\n", "format": "text"}, "multipart/form-data")],
    "POST /api/v1/local-queues/": [({"name": "second", "cluster_queue": "shared"}, "application/json")],
    "POST /api/v1/memberships/": [({"username": "alpha-viewer", "role": "viewer"}, "application/json")],
    "POST /api/v1/plans/": [({"model": "llama2-7b", "global_batch_size": 256, "pools": [{"pool": "h100-pool"}]},
                             "application/json")],
    "POST /api/v1/specs/apply/": [({"spec": "kind: training_job\nname: from-spec\nqueue: default\n"
                                             "resources: {accelerators: cpu}\n"}, "application/json")],
}
# Streams asked for on purpose (generated calls rarely ask for one, and then mostly with filters that match no
# row): each one's lines are checked against the schema.
STREAM_QUERIES = {"GET /api/v1/training-jobs/{id}/logs/": {"follow": True},
                  "GET /api/v1/training-jobs/{id}/metrics/": {"follow": True}}
# Operations that need an ended job (retry, delete): they get beta's cancelled job instead of its queued one.
ENDED_JOB_OPERATIONS = {"POST /api/v1/training-jobs/{id}/retry/", "DELETE /api/v1/training-jobs/{id}/"}
KNOWN_GOOD_EXAMPLES = 2
STATEFUL_SCENARIOS = 40
STATEFUL_STEPS = 8
STREAM_TIMEOUT_S = 1


def _hypothesis_settings(max_examples: int, **extra) -> hypothesis_settings:
    """Deterministic (derandomize, no example database) so CI sees the same calls every run."""
    return hypothesis_settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                               phases=[Phase.explicit, Phase.generate], print_blob=False,
                               suppress_health_check=list(HealthCheck), **extra)


NDJSON_LINES_VALIDATED = [0]


@schemathesis.deserializer("application/x-ndjson")
def _ndjson_lines(context, response):
    """An NDJSON stream read as the array of its lines, which is how the schema documents it."""
    lines = [json.loads(line) for line in response.content.decode("utf-8").splitlines() if line.strip()]
    NDJSON_LINES_VALIDATED[0] += len(lines)
    return lines


@pytest.fixture
def wsgi_app():
    """Django's WSGI application, called in this thread and so inside the test's transaction. Django's own
    test client does the same: it keeps request_started/finished from closing the test's connection."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def server_errors():
    """Tracebacks of exceptions the API turned into 500s, to put beside the failure that saw them."""
    seen: list[str] = []

    def record(sender, request=None, **kwargs):
        seen.append(traceback.format_exc(limit=-8))

    signals.got_request_exception.connect(record)
    yield seen
    signals.got_request_exception.disconnect(record)


@pytest.fixture
def fleet(world, demo_cluster, beta_objects):
    """Team beta's admin token and {path parameter value by resource}: beta's objects and the cluster's."""
    beta = world["beta"]
    _, raw = api_token_create(actor=beta["admin"], team=beta["team"], user=beta["admin"], name="schemathesis")
    ended = training_job_create(actor=beta["admin"], team=beta["team"], name="ended", local_queue=beta["queue"],
                                accelerator_types=["cpu"])
    training_job_cancel(actor=beta["admin"], job=ended, reason="for retry and delete")
    # Rows for the metrics and logs pages and streams to return (the run's workers write these in production).
    job, now = TrainingJob.objects.get(pk=beta_objects["training-jobs"]), timezone.now()
    TrainingMetric.objects.bulk_create(TrainingMetric(job=job, step=step, worker=0, loss=2.0 / step, step_time_s=0.5,
                                                      compute_time_s=0.4, tokens_per_s=1000.0, recorded_at=now)
                                       for step in (1, 2, 3))
    TrainingLogLine.objects.bulk_create(TrainingLogLine(job=job, worker=0, line=f"step {step}", recorded_at=now)
                                        for step in (1, 2, 3))
    ids = dict(beta_objects)
    ids.update({"nodes": Node.objects.order_by("pk").first().pk,
                "node-pools": NodePool.objects.order_by("pk").first().name,
                "cluster-queues": world["cluster_queue"].name,
                "priority-classes": world["priority"].name,
                "accelerator-types": "nvidia-h100"})
    return {"headers": {"Authorization": f"Bearer {raw}"}, "ids": ids, "ended_job": ended.pk}


def _load_schema(app):
    schema = schemathesis.openapi.from_wsgi(f"{API}schema/", app)
    # The token goes in every call's headers; schemathesis must not send its own made-up credentials.
    schema.config.generation.update(with_security_parameters=False)
    return schema


def _bound_stream(case) -> None:
    """A call that asks for a log or metric stream with a valid timeout waits at most STREAM_TIMEOUT_S."""
    query = case.query
    if not query or str(query.get("follow")).lower() != "true":
        return
    timeout = query.get("timeout", 1)
    if isinstance(timeout, int) and not isinstance(timeout, bool) and 1 <= timeout <= 3600:
        query["timeout"] = STREAM_TIMEOUT_S


class FailureLog:
    """Distinct failures (operation, mode, failure titles), each with the first call that showed it."""

    def __init__(self, server_errors: list[str]):
        self.server_errors = server_errors
        self.seen: dict[tuple, str] = {}

    def record(self, label: str, mode: str, exc: Exception) -> None:
        titles = tuple(sorted(f"{type(f).__name__}: {f.title}" for f in getattr(exc, "exceptions", [exc])))
        key = (label, mode, titles)
        if key not in self.seen:
            detail = str(exc)[:2500]
            if self.server_errors:
                detail += "\nServer traceback:\n" + self.server_errors[-1]
            self.seen[key] = detail
        self.server_errors.clear()

    def report(self) -> str:
        return "\n\n".join(f"=== {label} [{mode}]\n{detail}" for (label, mode, _), detail in self.seen.items())


def _call(case, headers: dict, failures: FailureLog, mode: str, answered: dict) -> str:
    """One call and its checks; `answered` collects the status codes. Returns the response's media type."""
    _bound_stream(case)
    response = case.call(headers=headers)
    answered[case.operation.label].add(response.status_code)
    try:
        case.validate_response(response, checks=CHECKS, headers=headers)
    except FailureGroup as exc:
        failures.record(case.operation.label, mode, exc)
    return response.headers.get("content-type", [""])[0]


def _run_examples(strategy, examples: int, mode: str, headers: dict, failures: FailureLog, calls: dict,
                  answered: dict) -> None:
    @_hypothesis_settings(examples)
    @given(case=strategy)
    def run(case):
        calls[mode] += 1
        with transaction.atomic():  # a savepoint, rolled back: every example sees the same world
            media_type = _call(case, headers, failures, mode, answered)
            transaction.set_rollback(True)
        calls["streams"] += media_type.startswith("application/x-ndjson")

    run()


def test_every_operation_conforms(fleet, wsgi_app, server_errors):
    schema = _load_schema(wsgi_app)
    failures = FailureLog(server_errors)
    calls = {"positive": 0, "negative": 0, "streams": 0}
    not_negatable = []
    answered: dict[str, set[int]] = defaultdict(set)
    operations = [result.ok() for result in schema.get_all_operations()]
    for operation in operations:
        resource = operation.path[len(API):].split("/")[0]
        path_names = [p.name for p in operation.path_parameters]
        real_id = fleet["ended_job"] if operation.label in ENDED_JOB_OPERATIONS else fleet["ids"].get(resource)
        real = {name: real_id for name in path_names}
        # (path parameters, fixed parts of the request, examples): everything generated on beta's object and,
        # for a path with an id, on generated ids; then the known-good bodies and the streams.
        runs = [(real, {}, EXAMPLES)] + ([({}, {}, GENERATED_ID_EXAMPLES)] if path_names else [])
        runs += [(real, {"body": body, "media_type": media_type}, KNOWN_GOOD_EXAMPLES)
                 for body, media_type in KNOWN_GOOD_BODIES.get(operation.label, [])]
        if operation.label in STREAM_QUERIES:
            runs.append((real, {"query": STREAM_QUERIES[operation.label]}, KNOWN_GOOD_EXAMPLES))
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for path_parameters, fixed, examples in runs:
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters or None,
                                                 **fixed)
                try:
                    _run_examples(strategy, examples, mode.value, fleet["headers"], failures, calls, answered)
                except Unsatisfiable:
                    # Nothing to negate (no parameters or body, or only a free-form string path segment).
                    if not fixed:
                        not_negatable.append(operation.label)
    total = calls["positive"] + calls["negative"]
    succeeded = {label for label, codes in answered.items() if any(200 <= code < 300 for code in codes)}
    streamed = calls["streams"]
    print(f"\nschemathesis: {len(operations)} operations, {total} calls checked ({calls['positive']} positive, "
          f"{calls['negative']} negative), {len(succeeded)} operations answered 2xx, {streamed} NDJSON streams "
          f"({NDJSON_LINES_VALIDATED[0]} lines validated); "
          f"{len(failures.seen)} distinct failures; no schema-violating input exists for "
          f"{len(set(not_negatable))} operations")
    print("  never 2xx (refused on purpose for this caller or these inputs): "
          + ", ".join(sorted({op.label for op in operations} - succeeded)))
    assert len(operations) >= 60, "the schema lost operations"
    assert streamed and NDJSON_LINES_VALIDATED[0], "no NDJSON stream with rows was checked against the schema"
    assert not failures.seen, failures.report()


def test_stateful_sequences_conform(fleet, wsgi_app, server_errors):
    schema = _load_schema(wsgi_app)
    # Sequences of schema-valid calls, so links reach their targets; the first test sends the negative data.
    schema.config.generation.update(modes=[GenerationMode.POSITIVE])
    failures = FailureLog(server_errors)
    base = schema.as_state_machine()
    links = schema.statistic.transitions.selected
    counts = {"scenarios": 0, "steps": 0}
    answered: dict[str, set[int]] = defaultdict(set)

    class Scenario(base):
        """One scenario of linked calls, inside one savepoint that is rolled back at its end."""

        def setup(self):
            counts["scenarios"] += 1
            self._savepoint = transaction.atomic()
            self._savepoint.__enter__()

        def teardown(self):
            transaction.set_rollback(True)
            self._savepoint.__exit__(None, None, None)

        def before_call(self, case):
            _bound_stream(case)
            if case.method.upper() == "GET" and not case.operation.path_parameters and case.query:
                # A sequence reads a list whole (page 1, no filter), so its rows feed the links that follow; a
                # generated page number is nearly always past the end (404) and ends the chain. The first test
                # sends generated pages and filters.
                case.query.clear()

        def get_call_kwargs(self, case):
            return {"headers": fleet["headers"]}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            counts["steps"] += 1
            answered[case.operation.label].add(response.status_code)
            try:
                case.validate_response(response, checks=STATEFUL_CHECKS, headers=kwargs.get("headers"),
                                       transport_kwargs=kwargs, recorder=self.recorder)
            except FailureGroup as exc:
                failures.record(case.operation.label, "stateful", exc)

    Scenario.run(settings=_hypothesis_settings(STATEFUL_SCENARIOS, stateful_step_count=STATEFUL_STEPS))
    succeeded = sorted(label for label, codes in answered.items() if any(200 <= code < 300 for code in codes))
    print(f"\nschemathesis stateful: {links} links inferred from the schema, {counts['scenarios']} scenarios, "
          f"{counts['steps']} calls checked over {len(answered)} operations ({len(succeeded)} answered 2xx), "
          f"{len(failures.seen)} distinct failures")
    for label in sorted(answered):
        print(f"  {label}: {sorted(answered[label])}")
    assert links >= 50, "schemathesis inferred too few links to test sequences"
    assert counts["steps"] >= STATEFUL_SCENARIOS, counts
    assert not failures.seen, failures.report()


def test_findings_stay_fixed(api, world, beta_objects):
    """Each bug schemathesis found, as one fixed request, so a change of the schema (and so of the generated
    data) cannot let one come back unnoticed."""
    from controlplane.tenancy.models import ApiToken
    from jobs.states import JobState

    client = api("beta", "admin")
    for query in ("page_size=abc", "page_size=-5", "page_size=1&page_size=2", "page=0"):  # were the default page
        assert client.get(f"{API}training-jobs/?{query}").status_code == 400, query
    unrouted = client.get(f"{API}datasets/1.5/")  # was Django's HTML 404 page
    assert unrouted.status_code == 404 and unrouted["Content-Type"] == "application/json"
    nul = client.get(f"{API}deployments/?search=a%00b")  # was a bare JSON list
    assert nul.status_code == 400 and isinstance(nul.json(), dict) and "detail" in nul.json()
    assert client.get(f"{API}nodes/?cordoned=yes").status_code == 400  # was ignored: every node listed
    far_offset = client.get(f"{API}training-jobs/", {"created_before": "2024-01-01T00:00:00-22:26"})
    assert far_offset.status_code == 200  # was a 500 on PostgreSQL
    jobs = TrainingJob.objects.count()
    typo = client.post(f"{API}specs/apply/?dry_run=ture", {"spec": "kind: training_job\nname: typo\nqueue: default\n"
                                                                    "resources: {accelerators: cpu}\n"}, format="json")
    assert typo.status_code == 400 and "dry_run" in typo.json() and TrainingJob.objects.count() == jobs  # was applied
    token = beta_objects["api-tokens"]
    assert client.delete(f"{API}api-tokens/{token}/").status_code == 204
    assert client.get(f"{API}api-tokens/{token}/").status_code == 404  # was 200, revoked but still there
    assert not ApiToken.objects.filter(pk=token).exists()
    job = beta_objects["training-jobs"]
    form = client.post(f"{API}training-jobs/{job}/cancel/", {"reason": "form"}, format="multipart")
    assert form.status_code == 415  # a form body was read as no body at all
    assert TrainingJob.objects.get(pk=job).state != JobState.CANCELLED
