"""Serializers for training jobs: the submitted spec in, spec + status + timeline out."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.common.api import StrictInputSerializer
from jobs import selectors
from jobs.models import (
    MAX_CHECKPOINT_INTERVAL_STEPS,
    MAX_DURATION_SECONDS,
    Trainer,
    TrainingFault,
    TrainingJob,
    TrainingJobEvent,
    TrainingLogLine,
    TrainingMetric,
)
from jobs.states import JobState


class CheckpointPolicySerializer(StrictInputSerializer):
    interval_steps = serializers.IntegerField(min_value=1, max_value=MAX_CHECKPOINT_INTERVAL_STEPS, default=100)
    keep_last = serializers.IntegerField(min_value=1, max_value=1000, default=3)


class TrainingJobCreateSerializer(StrictInputSerializer):
    team = serializers.CharField(required=False, allow_blank=True)
    name = serializers.SlugField(max_length=63)
    queue = serializers.SlugField(max_length=63, help_text="a LocalQueue of the team")
    priority = serializers.SlugField(max_length=63, required=False, allow_blank=True, default="")
    accelerator_types = serializers.ListField(child=serializers.SlugField(), min_length=1, max_length=16)
    # Upper bounds: the platform's limits (settings, FLEETYARD_MAX_*; the service checks them again, as the
    # spec of a retried job or one applied from YAML goes through it too).
    workers_min = serializers.IntegerField(min_value=1, max_value=settings.FLEETYARD_MAX_WORKERS_PER_JOB, default=1)
    workers_max = serializers.IntegerField(min_value=1, max_value=settings.FLEETYARD_MAX_WORKERS_PER_JOB,
                                           required=False, allow_null=True, default=None)
    devices_per_worker = serializers.IntegerField(min_value=0, max_value=settings.FLEETYARD_MAX_DEVICES_PER_WORKER,
                                                  default=1)
    cpus_per_worker = serializers.FloatField(
        min_value=0, max_value=512, required=False, allow_null=True, default=None,
        help_text="CPU cores each worker reserves; unset: 1, or on accelerator nodes the cores their devices come with "
                  "if fewer")
    trainer = serializers.ChoiceField(choices=Trainer.choices, default=Trainer.BUILTIN_LM)
    entrypoint = serializers.CharField(max_length=2000, required=False, allow_blank=True, default="")
    working_dir = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")
    hyperparameters = serializers.DictField(required=False, default=dict)
    # Values as sent: DRF trims a CharField's whitespace, so {"SEP": " "} reached the workers as "" (QA).
    envs = serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False), required=False,
                                 default=dict)
    dataset = serializers.CharField(max_length=200, required=False, allow_blank=True, default="",
                                    help_text="dataset://name@version")
    checkpoint = CheckpointPolicySerializer(required=False, default=dict)
    max_restarts = serializers.IntegerField(min_value=0, max_value=1000, default=3)
    max_duration_seconds = serializers.IntegerField(
        min_value=1, max_value=MAX_DURATION_SECONDS, required=False, allow_null=True, default=None,
        error_messages={"max_value": f"at most {MAX_DURATION_SECONDS} seconds ({MAX_DURATION_SECONDS // 86400} days)"})
    parallelism = serializers.DictField(
        required=False, default=dict,
        help_text='{"mode": "auto", "model": "llama2-7b" or a model description, "global_batch_size": 256}: the '
                  "parallel-strategy planner picks the layout per accepted type and sizes the gang")


class TrainingJobSpecSerializer(serializers.ModelSerializer):
    queue = serializers.CharField(source="local_queue.name")
    priority = serializers.CharField(source="priority_class.name", allow_null=True, default=None)
    dataset = serializers.SerializerMethodField()
    checkpoint = serializers.SerializerMethodField()
    secrets = serializers.SerializerMethodField(help_text="names of the secrets given to the workers (never values)")

    class Meta:
        model = TrainingJob
        fields = ["queue", "priority", "accelerator_types", "workers_min", "workers_max", "devices_per_worker",
                  "cpus_per_worker", "trainer", "entrypoint", "working_dir", "hyperparameters", "envs", "secrets",
                  "dataset", "checkpoint", "max_restarts", "max_duration_seconds", "parallelism"]

    def get_secrets(self, obj) -> list[str]:
        return sorted(obj.secret_envs or {})

    def get_dataset(self, obj) -> str | None:
        version = obj.dataset_version
        return f"dataset://{version.dataset.name}@{version.version}" if version else None

    def get_checkpoint(self, obj) -> dict:
        return {"interval_steps": obj.checkpoint_interval_steps, "keep_last": obj.checkpoint_keep_last}


class GoodputSerializer(serializers.Serializer):
    ettr = serializers.FloatField(help_text="effective training time ratio: productive / wall since first start")
    wall_s = serializers.FloatField()
    productive_s = serializers.FloatField()
    detection_s = serializers.FloatField()
    restart_s = serializers.FloatField()
    recompute_s = serializers.FloatField()
    paused_s = serializers.FloatField()
    interruptions = serializers.DictField(child=serializers.IntegerField())
    pauses = serializers.DictField(child=serializers.IntegerField())
    recomputed_steps = serializers.IntegerField()


class GoodputJobSerializer(GoodputSerializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    team = serializers.CharField()
    state = serializers.ChoiceField(choices=[s.value for s in JobState])


class GoodputOverviewSerializer(serializers.Serializer):
    """The answer of GET /training-jobs/goodput/ (documented as one job's GoodputSerializer before; found by
    schemathesis, S7): the started jobs you can see, together and one by one."""

    jobs = serializers.IntegerField(help_text="jobs that have started")
    ettr = serializers.FloatField(allow_null=True, help_text="productive / wall time of all of them; null when none")
    wall_s = serializers.FloatField()
    productive_s = serializers.FloatField()
    detection_s = serializers.FloatField()
    restart_s = serializers.FloatField()
    recompute_s = serializers.FloatField()
    paused_s = serializers.FloatField()
    per_job = GoodputJobSerializer(many=True)


class TrainerLayoutSerializer(serializers.Serializer):
    tp = serializers.IntegerField(help_text="tensor-parallel ranks (workers) per model replica")
    pp = serializers.IntegerField(help_text="pipeline stages (workers) per model replica")
    dp = serializers.IntegerField(help_text="data-parallel replicas")
    micro_batches = serializers.IntegerField(help_text="micro-batches per step (the pipeline's GPipe schedule)")
    source = serializers.CharField(help_text="where the degrees come from, or why the trainer runs data parallel")


class TrainingJobStatusSerializer(serializers.ModelSerializer):
    state = serializers.ChoiceField(choices=[s.value for s in JobState])
    reason = serializers.SerializerMethodField(help_text="why it is in its state; another team's workloads are not "
                                                         "named by id (\"another team's job\")")
    changed_at = serializers.DateTimeField(source="state_changed_at")
    run_state = serializers.CharField(source="runtime_state")
    step = serializers.IntegerField(source="current_step")
    workers = serializers.SerializerMethodField()
    goodput = serializers.SerializerMethodField()
    trainer_layout = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJob
        fields = ["state", "reason", "changed_at", "queue_position", "admitted_accelerator_type", "placement",
                  "compute_handle", "attempt", "run_state", "step", "last_checkpoint_step", "workers",
                  "observed_nodes", "restarts", "started_at", "finished_at", "goodput", "parallel_plan",
                  "trainer_layout"]

    def get_reason(self, obj) -> str:
        return selectors.reason_shown_for_team(text=obj.state_reason, team_id=obj.team_id)

    def get_workers(self, obj) -> int:
        return len(obj.observed_nodes or [])

    @extend_schema_field(GoodputSerializer(allow_null=True))
    def get_goodput(self, obj) -> dict | None:
        summary = selectors.training_job_goodput(job=obj)
        return summary.to_dict() if summary else None

    @extend_schema_field(TrainerLayoutSerializer(allow_null=True))
    def get_trainer_layout(self, obj) -> dict | None:
        return selectors.training_job_trainer_layout(job=obj)


class TrainingJobSerializer(serializers.ModelSerializer):
    team = serializers.CharField(source="team.name")
    spec = TrainingJobSpecSerializer(source="*")
    status = TrainingJobStatusSerializer(source="*")
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = TrainingJob
        fields = ["id", "team", "name", "spec", "status", "created_by", "created_at"]


class TrainingJobEventSerializer(serializers.ModelSerializer):
    reason = serializers.SerializerMethodField(help_text="another team's workloads are not named by id")
    data = serializers.SerializerMethodField()

    class Meta:
        model = TrainingJobEvent
        fields = ["id", "from_state", "to_state", "reason", "actor_label", "data", "created_at"]

    def get_reason(self, event) -> str:
        return selectors.reason_shown_for_team(text=event.reason, team_id=event.subject.team_id)

    @extend_schema_field(OpenApiTypes.OBJECT)
    def get_data(self, event) -> dict:
        return selectors.event_data_shown_for_team(data=event.data, team_id=event.subject.team_id)


class CancelSerializer(StrictInputSerializer):
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")


class TrainingMetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrainingMetric
        fields = ["id", "attempt", "step", "worker", "loss", "step_time_s", "compute_time_s", "tokens_per_s",
                  "recorded_at"]


class TrainingLogLineSerializer(serializers.ModelSerializer):
    class Meta:
        model = TrainingLogLine
        fields = ["id", "attempt", "worker", "line", "recorded_at"]


class TrainingFaultSerializer(serializers.ModelSerializer):
    detection_s = serializers.FloatField(read_only=True)
    restart_s = serializers.FloatField(read_only=True, allow_null=True)

    class Meta:
        model = TrainingFault
        fields = ["id", "attempt", "kind", "node", "worker", "step", "evidence", "data", "advisory", "occurred_at",
                  "detected_at", "resumed_at", "detection_s", "restart_s", "recomputed_steps", "recomputed_s"]


class CheckpointSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    name = serializers.CharField()
    size_bytes = serializers.IntegerField()
    created_at = serializers.DateTimeField()
    files = serializers.ListField(child=serializers.CharField())
    metadata = serializers.DictField()


class CheckpointRequestedSerializer(serializers.Serializer):
    requested = serializers.BooleanField()
    step = serializers.IntegerField(allow_null=True, help_text="the step the job was at when asked")


class TrainingMetricPageSerializer(serializers.Serializer):
    results = TrainingMetricSerializer(many=True)
    next_after = serializers.IntegerField(allow_null=True, help_text="pass as `after` for the rows that follow")


class TrainingLogPageSerializer(serializers.Serializer):
    results = TrainingLogLineSerializer(many=True)
    next_after = serializers.IntegerField(allow_null=True, help_text="pass as `after` for the rows that follow")


class StreamQuerySerializer(StrictInputSerializer):
    """Query parameters of the logs endpoint (and, with since_step, of the metrics endpoint)."""

    after = serializers.IntegerField(min_value=0, required=False, help_text="only rows with a larger id")
    worker = serializers.IntegerField(min_value=0, required=False)
    limit = serializers.IntegerField(min_value=1, max_value=10000, default=1000)
    follow = serializers.BooleanField(default=False, help_text="stream new rows (NDJSON) until the job ends")
    timeout = serializers.IntegerField(min_value=1, max_value=3600, default=300,
                                       help_text="with follow: stop streaming after this many seconds")


class MetricQuerySerializer(StreamQuerySerializer):
    """Query parameters of the metrics endpoint. `since_step` is not one of the logs' (a log line has no step: it was
    accepted there and ignored, so `?since_step=100` listed every line; QA)."""

    since_step = serializers.IntegerField(min_value=0, required=False, help_text="only rows of this step or later")
