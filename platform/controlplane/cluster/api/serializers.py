"""Serializers for accelerator types, node pools, observed nodes, and plans (input and answer)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.cluster.models import MAX_DEVICES_PER_NODE, AcceleratorType, Node, NodePool
from controlplane.cluster.plans import MAX_GLOBAL_BATCH_SIZE
from controlplane.common.api import StrictInputMixin, StrictInputSerializer
from controlplane.planning.model import RECOMPUTE_MODES
from controlplane.planning.presets import PRESET_NAMES


class AcceleratorTypeSerializer(serializers.ModelSerializer):
    class Meta:
        model = AcceleratorType
        fields = ["id", "slug", "vendor", "model", "bf16_dense_tflops", "fp8_dense_tflops", "memory_gb",
                  "memory_bandwidth_gbps", "interconnect", "price_per_hour_usd", "sources", "notes"]


class NodePoolSerializer(StrictInputMixin, serializers.ModelSerializer):
    accelerator_type = serializers.SlugRelatedField(slug_field="slug", queryset=AcceleratorType.objects.all())
    node_count = serializers.IntegerField(read_only=True)
    healthy_node_count = serializers.IntegerField(read_only=True)
    capacity_devices = serializers.FloatField(read_only=True, help_text="devices of its healthy nodes")
    free_devices = serializers.FloatField(read_only=True,
                                          help_text="free devices of its healthy nodes that are not cordoned")
    effective_intra_node_gbps = serializers.FloatField(
        source="link_bandwidth.intra_node_gbps", read_only=True, allow_null=True,
        help_text="what the planner uses: the pool's own figure, else the type's assumed default, else null")
    effective_inter_node_gbps = serializers.FloatField(
        source="link_bandwidth.inter_node_gbps", read_only=True, allow_null=True,
        help_text="what the planner uses: the pool's own figure, else the type's assumed default, else null")
    link_bandwidth_assumed = serializers.BooleanField(
        source="link_bandwidth.assumed", read_only=True,
        help_text="true when an effective figure is an assumed default, not the pool's own")
    link_bandwidth_note = serializers.CharField(source="link_bandwidth.note", read_only=True)

    class Meta:
        model = NodePool
        fields = ["id", "name", "accelerator_type", "devices_per_node", "simulated", "description",
                  "intra_node_gbps", "inter_node_gbps", "effective_intra_node_gbps", "effective_inter_node_gbps",
                  "link_bandwidth_assumed", "link_bandwidth_note",
                  "node_count", "healthy_node_count", "capacity_devices", "free_devices", "created_at"]
        read_only_fields = ["id", "created_at"]
        # Uniqueness is the service's check, so the error reads the same from every entry point. An operator
        # says whether a pool's chips are simulated (leaving it out was a 500; found by the S3 role matrix).
        extra_kwargs = {"name": {"validators": []}, "simulated": {"required": True}}


class NodeSerializer(serializers.ModelSerializer):
    pool = serializers.SlugRelatedField(slug_field="name", read_only=True)
    accelerator_type = serializers.CharField(source="pool.accelerator_type.slug", read_only=True)

    class Meta:
        model = Node
        fields = ["id", "name", "pool", "accelerator_type", "ray_node_id", "address", "leaf_group", "health",
                  "cordoned", "capacity_devices", "free_devices", "capacity_cpus", "free_cpus", "labels",
                  "simulated", "last_seen_at"]
        read_only_fields = fields


class NodeCordonSerializer(StrictInputSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


# -- plans (POST /api/v1/plans/) ----------------------------------------------------------------------------

@extend_schema_field({
    "oneOf": [
        {"type": "string", "enum": list(PRESET_NAMES), "description": "a named model preset"},
        {"type": "object", "additionalProperties": {},
         "description": "ModelSpec fields (layers, hidden, heads, seq_len, vocab, kv_heads, ffn_hidden, experts, "
                        "top_k, precision, gated_mlp, bias, tied_embeddings, learned_positions, dropout, name) or "
                        "their Hugging Face names; or {\"preset\": name, ...fields to override}"},
    ],
})
class PlanModelField(serializers.Field):
    """A preset name or an object of model fields; the planner core checks the fields themselves."""

    default_error_messages = {"invalid": "give a preset name or an object of model fields"}

    def to_internal_value(self, data):
        if isinstance(data, str | dict):
            return data
        self.fail("invalid")

    def to_representation(self, value):
        return value


class PlanPoolSerializer(StrictInputSerializer):
    pool = serializers.SlugField(max_length=63, help_text="a node pool's name; its healthy, uncordoned nodes")
    devices = serializers.IntegerField(required=False, min_value=1, max_value=1_000_000,
                                       help_text="use this many of the pool's devices (whole nodes, or part of one)")


class PlanDevicesSerializer(StrictInputSerializer):
    accelerator_type = serializers.SlugField(max_length=63, help_text="an accelerator type's slug")
    count = serializers.IntegerField(min_value=1, max_value=1_000_000,
                                     help_text="devices: whole nodes, or at most one node")
    devices_per_node = serializers.IntegerField(required=False, default=8, min_value=1,
                                        max_value=MAX_DEVICES_PER_NODE)
    intra_node_gbps = serializers.FloatField(required=False, min_value=0.001,
                                             help_text="GB/s per device per direction inside a node; default: the "
                                                       "type's assumed default")
    inter_node_gbps = serializers.FloatField(required=False, min_value=0.001,
                                             help_text="GB/s per device per direction between nodes; default: the "
                                                       "type's assumed default")


class PlanOptionsSerializer(StrictInputSerializer):
    """What the search may use (``controlplane.planning.PlanOptions``)."""

    allow_recompute = serializers.BooleanField(required=False)
    allow_selective_recompute = serializers.BooleanField(required=False)
    allow_norm_recompute = serializers.BooleanField(
        required=False, help_text="recompute the two layer norms of each layer (needs unfused norm modules)")
    allow_zero = serializers.BooleanField(required=False, help_text="ZeRO-1 optimizer-state sharding")
    allow_interleave = serializers.BooleanField(required=False, help_text="interleaved 1F1B pipeline schedule")
    allow_sequence_parallel = serializers.BooleanField(required=False)
    allow_heterogeneous = serializers.BooleanField(required=False,
                                                   help_text="pipelines whose stages run on different pools")
    flash_attention = serializers.BooleanField(required=False)
    max_micro_batch = serializers.IntegerField(required=False, min_value=1, max_value=256)
    max_alternatives = serializers.IntegerField(required=False, min_value=0, max_value=20)


class PlanSerializer(StrictInputSerializer):
    model = PlanModelField()
    global_batch_size = serializers.IntegerField(min_value=1, max_value=MAX_GLOBAL_BATCH_SIZE,
                                                 help_text="sequences per optimizer step")
    pools = PlanPoolSerializer(many=True, required=False, default=list)
    devices = PlanDevicesSerializer(many=True, required=False, default=list,
                                    help_text="hypothetical devices, for clusters that do not exist (yet)")
    options = PlanOptionsSerializer(required=False, default=dict)
    compare = serializers.BooleanField(required=False, default=False,
                                       help_text="also plan each accelerator type alone, beside the mix")


class PlanStageSerializer(serializers.Serializer):
    pool = serializers.CharField()
    tp = serializers.IntegerField()
    layers = serializers.IntegerField()


class PlanLayoutSerializer(serializers.Serializer):
    dp = serializers.IntegerField()
    tp = serializers.IntegerField()
    pp = serializers.IntegerField()
    ep = serializers.IntegerField()
    micro_batch_size = serializers.IntegerField()
    recompute = serializers.ChoiceField(choices=list(RECOMPUTE_MODES))
    zero = serializers.BooleanField()
    virtual_stages = serializers.IntegerField()
    sequence_parallel = serializers.BooleanField()
    shard_gradients = serializers.BooleanField(help_text="ZeRO-2: gradients sharded over data parallel as well as "
                                                         "the optimizer state (zero)")
    stages = PlanStageSerializer(many=True)
    devices = serializers.IntegerField()
    devices_by_pool = serializers.DictField(child=serializers.IntegerField())


class PlanPredictionSerializer(serializers.Serializer):
    layout = PlanLayoutSerializer()
    description = serializers.CharField()
    num_micro_batches = serializers.IntegerField()
    step_time_s = serializers.FloatField()
    tokens_per_s = serializers.FloatField()
    mfu = serializers.FloatField(help_text="model FLOPs / (step time x the devices' dense peak)")
    model_tflops_per_device = serializers.FloatField()
    hardware_tflops_per_device = serializers.FloatField(help_text="with recomputation")
    memory_gb = serializers.FloatField(help_text="the fullest device")
    memory_limit_gb = serializers.FloatField()
    breakdown = serializers.DictField(child=serializers.FloatField(), help_text="seconds per step")
    memory_breakdown = serializers.DictField(child=serializers.FloatField(), help_text="GB on the fullest device")
    reason = serializers.CharField(allow_blank=True)
    cost_per_hour_usd = serializers.FloatField(allow_null=True,
                                               help_text="the devices the layout uses; null when a price is unknown")
    cost_per_million_tokens_usd = serializers.FloatField(allow_null=True)
    unpriced_accelerator_types = serializers.ListField(child=serializers.CharField())


class PlanPoolResultSerializer(serializers.Serializer):
    name = serializers.CharField()
    source = serializers.ChoiceField(choices=["node-pool", "hypothetical"])
    accelerator_type = serializers.CharField()
    nodes = serializers.IntegerField()
    devices_per_node = serializers.IntegerField()
    devices = serializers.IntegerField()
    intra_node_gbps = serializers.FloatField()
    inter_node_gbps = serializers.FloatField()
    link_bandwidth_assumed = serializers.BooleanField()
    link_bandwidth_note = serializers.CharField()
    price_per_hour_usd = serializers.FloatField(allow_null=True)
    achievable_fraction = serializers.FloatField()
    achievable_fraction_source = serializers.CharField(
        help_text="where the fraction comes from: measured runs of this type, a published calibration, or assumed")
    simulated = serializers.BooleanField(allow_null=True)


class PlanModelResultSerializer(serializers.Serializer):
    preset = serializers.CharField(allow_null=True)
    name = serializers.CharField(allow_blank=True)
    layers = serializers.IntegerField()
    hidden = serializers.IntegerField()
    heads = serializers.IntegerField()
    kv_heads = serializers.IntegerField()
    ffn_hidden = serializers.IntegerField()
    seq_len = serializers.IntegerField()
    vocab = serializers.IntegerField()
    experts = serializers.IntegerField()
    top_k = serializers.IntegerField()
    precision = serializers.CharField()
    gated_mlp = serializers.BooleanField()
    bias = serializers.BooleanField()
    tied_embeddings = serializers.BooleanField()
    learned_positions = serializers.BooleanField()
    dropout = serializers.BooleanField()
    parameters = serializers.IntegerField()
    active_parameters = serializers.IntegerField()


class PlanTypeComparisonSerializer(serializers.Serializer):
    accelerator_type = serializers.CharField()
    pools = serializers.ListField(child=serializers.CharField())
    devices = serializers.IntegerField()
    feasible = serializers.BooleanField()
    reason = serializers.CharField()
    best = PlanPredictionSerializer(allow_null=True)
    step_time_ratio_to_mix = serializers.FloatField(allow_null=True,
                                                    help_text="this type's step time / the mix's (> 1: the mix "
                                                              "is faster)")
    cost_per_million_tokens_ratio_to_mix = serializers.FloatField(allow_null=True)


class PlanComparisonSerializer(serializers.Serializer):
    by_type = PlanTypeComparisonSerializer(many=True)
    fastest_single_type = serializers.CharField(allow_null=True)
    cheapest_single_type = serializers.CharField(allow_null=True)
    mix_speedup_over_fastest_single_type = serializers.FloatField(allow_null=True)


class PlanResultSerializer(serializers.Serializer):
    model = PlanModelResultSerializer()
    global_batch_size = serializers.IntegerField()
    pools = PlanPoolResultSerializer(many=True)
    feasible = serializers.BooleanField()
    reason = serializers.CharField()
    best = PlanPredictionSerializer(allow_null=True)
    alternatives = PlanPredictionSerializer(many=True)
    candidates_evaluated = serializers.IntegerField()
    search_time_s = serializers.FloatField()
    assumptions = serializers.ListField(child=serializers.CharField())
    compare = PlanComparisonSerializer(allow_null=True)
