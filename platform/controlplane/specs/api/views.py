"""POST /api/v1/specs/apply/: submit a fleetyard YAML spec (a training job or a deployment).

Body: the YAML itself (Content-Type application/yaml) or JSON {"spec": "<yaml>", "filename": ...,
"secrets": {NAME: value}}. `?dry_run=1` returns the plan (chosen accelerator type and why, cost per hour,
queue position) without creating anything. Every mistake is a 400 whose `spec` lists
`file:line: field: reason` lines, including those the server finds (a queue without quota for a type)."""

from __future__ import annotations

import yaml
from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.parsers import BaseParser
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import APIView

from controlplane.common.api import StrictInputSerializer
from controlplane.common.errors import DomainError
from controlplane.common.parsers import BoundedJSONParser
from controlplane.common.references import resolve_local_queue, resolve_priority_class
from controlplane.specs import selectors, services
from controlplane.tenancy.api.scoping import TeamScopedMixin
from fleetyard.errors import SpecError, SpecIssue
from fleetyard.spec import JOB, Spec, parse_spec
from inference.api.serializers import DeploymentCreateSerializer, DeploymentSerializer
from jobs.api.serializers import TrainingJobCreateSerializer, TrainingJobSerializer

# The largest spec accepted (FLEETYARD_MAX_SPEC_BYTES); fleetyard.spec also bounds its lines and flow items.
MAX_SPEC_BYTES = settings.FLEETYARD_MAX_SPEC_BYTES


class YamlParser(BaseParser):
    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        """The text, or the bytes as they came when they are not UTF-8 (the view says where). They were decoded with
        U+FFFD for each bad byte, so a Latin-1 or UTF-16 file got "name: must be lowercase letters ..., got
        '\ufffd\ufffd'" instead of what the CLI says of the same file (QA)."""
        raw = stream.read(MAX_SPEC_BYTES + 1)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw


class TextYamlParser(YamlParser):
    media_type = "text/yaml"


class SpecApplySerializer(StrictInputSerializer):
    # Not required: a missing one is an empty spec, refused in the shape of every spec error (with `filename`, it was
    # DRF's "This field is required." without `errors`).
    spec = serializers.CharField(max_length=MAX_SPEC_BYTES, trim_whitespace=False, allow_blank=True, required=False,
                                 default="", help_text="the YAML text (an empty or missing one is refused as a spec "
                                                       "error)")
    filename = serializers.CharField(max_length=200, required=False, default="spec.yaml")
    secrets = serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False),
                                    required=False, default=dict)


_RESPONSE = inline_serializer("SpecApplyResult", fields={
    "kind": serializers.ChoiceField(choices=["training_job", "deployment"]),
    "dry_run": serializers.BooleanField(),
    "plan": serializers.DictField(),
    "warnings": serializers.ListField(child=serializers.CharField()),
    "object": serializers.DictField(allow_null=True),
})


def _dry_run(request) -> bool:
    """`?dry_run=`: 1/true/yes or 0/false/no (or absent). Anything else is a 400: `dry_run=ture` applied the spec
    for real before (found by schemathesis, S7). So are a repeated `dry_run` and any other query parameter (but
    `format`): `?dryrun=1` or `?dry-run=1` applied the spec for real, and `?dry_run=1&dry_run=0` too (the last value
    won; found by QA)."""
    accepted = {"dry_run", api_settings.URL_FORMAT_OVERRIDE} - {None}
    unknown = sorted(set(request.query_params) - accepted)
    if unknown:
        reason = f"unknown query parameter; accepted: {', '.join(sorted(accepted))}"
        raise serializers.ValidationError({name: [reason] for name in unknown})
    values = request.query_params.getlist("dry_run")
    if len(values) > 1:
        raise serializers.ValidationError({"dry_run": ["give it once"]})
    value = values[0].lower() if values else ""
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise serializers.ValidationError({"dry_run": ["must be true or false"]})


class SpecApplyView(TeamScopedMixin, APIView):
    parser_classes = [BoundedJSONParser, YamlParser, TextYamlParser]
    submission_actions = ("post",)  # may answer 429 (controlplane.common.openapi)

    @extend_schema(request={"application/json": SpecApplySerializer, "application/yaml": str},
                   parameters=[OpenApiParameter("dry_run", type=bool, required=False)],
                   responses={200: _RESPONSE, 201: _RESPONSE})
    def post(self, request):
        if isinstance(request.data, str | bytes):
            if len(request.data) > MAX_SPEC_BYTES:
                return Response({"spec": [f"spec.yaml: larger than {MAX_SPEC_BYTES} bytes"]},
                                status=status.HTTP_400_BAD_REQUEST)
            if isinstance(request.data, bytes):
                return _spec_errors([_not_utf8(request.data)], "spec.yaml")
            text, filename, secrets = request.data, "spec.yaml", {}
        elif not request.data:  # an empty body (DRF parses none): an empty spec
            text, filename, secrets = "", "spec.yaml", {}
        else:
            data = SpecApplySerializer(data=request.data)
            data.is_valid(raise_exception=True)
            text, filename, secrets = (data.validated_data[k] for k in ("spec", "filename", "secrets"))
        dry_run = _dry_run(request)
        if not text.strip():
            # in the shape of every other spec error (it was DRF's {"spec": ["This field is required."]} or "may not
            # be blank", without `errors`; QA)
            return _spec_errors([SpecIssue(None, "", "the spec is empty: write a YAML mapping (name: ..., queue: ..., "
                                                     "resources: ...)")], filename)
        try:
            spec = parse_spec(text, filename=filename)
        except SpecError as exc:
            return _spec_errors(exc.issues, filename)
        body = {k: v for k, v in spec.body.items() if not k.startswith("_")}
        create = (TrainingJobCreateSerializer if spec.kind == JOB else DeploymentCreateSerializer)(data=body)
        if not create.is_valid():
            return _spec_errors(_issues_from(spec, create.errors, text=text), filename)
        values = dict(create.validated_data)
        try:
            team = self.resolve_team(values.pop("team", None))
            if spec.kind == JOB:
                values["secret_envs"] = services.spec_job_secrets(secret_names=spec.secrets, secrets=secrets)
            elif secrets:
                raise DomainError("a deployment takes no secrets", field="secrets")
            plan = self._plan(spec, team, values)
            created = None
            if dry_run:
                services.spec_apply_rehearse(actor=request.user, team=team, kind=spec.kind, values=values,
                                             spec_yaml=text)
            else:
                obj = services.spec_apply(actor=request.user, team=team, kind=spec.kind, values=values,
                                          spec_yaml=text)
                serializer = TrainingJobSerializer if spec.kind == JOB else DeploymentSerializer
                created = serializer(type(obj).objects.get(pk=obj.pk)).data
        except DomainError as exc:
            if exc.status_code != 400:
                raise
            path, line = _locate(spec, text, exc.field or "")
            issue = SpecIssue(line, path if exc.field else "", exc.message)
            return _spec_errors([issue], filename, extra=exc.as_dict())
        except DjangoValidationError as exc:
            # A model's own validation (a column's range, say): still spec lines, not a bare REST field body.
            errors = exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
            return _spec_errors(_issues_from(spec, errors, text=text), filename)
        return Response({"kind": spec.kind, "dry_run": dry_run, "plan": plan, "warnings": spec.warnings,
                         "object": created}, status=status.HTTP_200_OK if dry_run else status.HTTP_201_CREATED)

    @staticmethod
    def _plan(spec: Spec, team, values: dict) -> dict:
        local_queue = resolve_local_queue(team=team, name=values["queue"])
        priority_class = resolve_priority_class(name=values.get("priority", ""))
        types = list(values["accelerator_types"])
        parallel = None
        if spec.kind == JOB:
            from jobs.services import worker_cpus

            cpus = worker_cpus(accelerator_types=types, devices_per_worker=values["devices_per_worker"],
                               cpus_per_worker=values.get("cpus_per_worker"))
            members = values["workers_min"]
            if values.get("parallelism"):
                # as the submit plans it (jobs.services.training_job_create): a model no accepted type can run is
                # refused here too, and the types and gang size are the plan's (before, the dry run showed "fits
                # now: yes" and the apply then failed on parallelism)
                from jobs.planning import plan_job_gang

                parallel, types, members, _ = plan_job_gang(
                    parallelism=values["parallelism"], accelerator_types=types, workers_min=members,
                    workers_max=values.get("workers_max") or members, devices_per_worker=values["devices_per_worker"])
            units = {t: cpus if t == "cpu" else float(values["devices_per_worker"]) for t in types}
        else:
            from inference.workflows import replica_cpus

            # a replica on the CPU pool takes the cores its server reserves, as the cycle counts it (it said "needs 1
            # CPU cores", the device count, for 0.25-core replicas; QA)
            units = {t: replica_cpus(accelerator_type="cpu", devices_per_replica=0.0) if t == "cpu"
                     else float(values["devices_per_replica"]) for t in types}
            members = values["replicas_min"]
        plan = selectors.spec_plan(kind=spec.kind, name=values["name"], local_queue=local_queue,
                                   priority_class=priority_class, accelerator_types=types, units_by_type=units,
                                   members=members, workload_class=_workload_class(spec, values))
        if parallel is not None:
            shown = ("description", "tp", "pp", "dp", "step_time_s", "tokens_per_s", "mfu", "memory_gb")
            plan["parallel_plan"] = {slug: {key: summary[key] for key in shown}
                                     for slug, summary in parallel["by_type"].items()}
            plan["parallel_plan_cannot_run"] = parallel["cannot_run"]
            # why the gang differs from the spec's workers, as the job keeps it (before, the dry run showed only the
            # changed size, and "it can never run ... it needs 8" for a spec of 1-8 workers; QA)
            plan["notes"] = [*plan.get("notes", []),
                             *(parallel[key] for key in ("sized_by_plan", "min_workers_by_plan") if key in parallel)]
        return plan


def _workload_class(spec: Spec, values: dict) -> str:
    """The class the scheduling cycle will rank the job's types by (jobs/efficiency.py)."""
    if spec.kind != JOB:
        return "serving"
    from jobs.efficiency import workload_class_of

    return workload_class_of(trainer=values.get("trainer") or "builtin", hyperparameters=values.get("hyperparameters"),
                             entrypoint=values.get("entrypoint") or "")


def _locate(spec: Spec, text: str, rest_field: str) -> tuple[str, int | None]:
    """Where a REST field came from in the spec (Spec.locate). A field the spec left out (a default: workers,
    replicas, secrets) is placed at the line of the mapping that would hold it; the parser names it as the spec would
    write it (`workers`, not its alias `num_nodes`): its error was reported as `num_nodes` without a line (QA)."""
    path, line = spec.locate(rest_field)
    head = rest_field.split(".")[0]
    if line is not None or not (rest_field in spec.origins or head in spec.origins):
        return path, line
    return path, _mapping_line(text, path.rpartition(".")[0])


def _mapping_line(text: str, path: str) -> int | None:
    """The line of the mapping at `path` ("" for the top level; the key's line for a nested one) in a spec that
    parsed, or None where there is none."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # pragma: no cover - the spec parsed before
        return None
    line = node.start_mark.line + 1 if isinstance(node, yaml.MappingNode) else None
    for part in path.split(".") if path else []:
        if not isinstance(node, yaml.MappingNode):
            return None
        found = next(((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def _issues_from(spec: Spec, errors, prefix: str = "", *, text: str = "") -> list[SpecIssue]:
    """DRF's `{"field": ["reason"]}` (nested for sla, checkpoint) as spec issues at the spec's lines."""
    issues = []
    for name, value in errors.items():
        rest = f"{prefix}{name}"
        if isinstance(value, dict):
            issues += _issues_from(spec, value, prefix=f"{rest}.", text=text)
            continue
        path, line = _locate(spec, text, rest)
        for reason in value if isinstance(value, list) else [value]:
            issues.append(SpecIssue(line, path, f"{reason}" if path == rest else f"{rest}: {reason}"))
    return issues


def _not_utf8(raw: bytes) -> SpecIssue:
    """Where a body stops being UTF-8, as the CLI says it of a file (fleetyard.cli._read_spec)."""
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return SpecIssue(raw.count(b"\n", 0, exc.start) + 1, "", f"not UTF-8 text (a spec is a YAML file); byte "
                                                                 f"{raw[exc.start]:#04x} at offset {exc.start}")
    raise ValueError("the body is UTF-8")


def _spec_errors(issues: list[SpecIssue], filename: str, extra: dict | None = None) -> Response:
    body = {"spec": [issue.format(filename) for issue in issues], "errors": [i.to_dict() for i in issues]}
    if extra:
        body.update({k: v for k, v in extra.items() if k not in body})
    return Response(body, status=status.HTTP_400_BAD_REQUEST)
