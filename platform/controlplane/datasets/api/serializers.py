"""Serializers for datasets and dataset versions."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.common.api import StrictInputSerializer
from controlplane.datasets.models import Dataset, DatasetFormat, DatasetVersion


class DatasetSerializer(serializers.ModelSerializer):
    team = serializers.SlugRelatedField(slug_field="name", read_only=True)
    version_count = serializers.IntegerField(read_only=True)
    latest_version = serializers.IntegerField(read_only=True, allow_null=True)

    class Meta:
        model = Dataset
        fields = ["id", "team", "name", "description", "version_count", "latest_version", "created_at"]


class DatasetCreateSerializer(StrictInputSerializer):
    team = serializers.CharField(required=False, allow_blank=True)
    name = serializers.SlugField(max_length=63)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class DatasetVersionSerializer(serializers.ModelSerializer):
    dataset = serializers.CharField(source="dataset.name", read_only=True)
    team = serializers.CharField(source="dataset.team.name", read_only=True)
    reference = serializers.SerializerMethodField(help_text="dataset://name@version, as job specs cite it")
    uri = serializers.CharField(source="shown_uri", read_only=True,
                                help_text="where the data lives: upload://team/dataset/vN/file for an uploaded "
                                          "file; credentials, if a version holds any, masked")

    class Meta:
        model = DatasetVersion
        fields = ["id", "team", "dataset", "version", "reference", "uri", "uploaded", "size_bytes",
                  "checksum_sha256", "format", "description", "created_at"]

    def get_reference(self, obj) -> str:
        return f"dataset://{obj.dataset.name}@{obj.version}"


class DatasetVersionRegisterSerializer(StrictInputSerializer):
    """Register by URI (JSON), or upload a file (multipart with `file`)."""

    uri = serializers.CharField(max_length=1000, required=False, allow_blank=True, default="")
    file = serializers.FileField(required=False, allow_null=True, default=None)
    format = serializers.ChoiceField(choices=DatasetFormat.choices, default=DatasetFormat.OTHER)
    # The column is a 64-bit integer: a larger size was a 500 at the insert (found by QA).
    size_bytes = serializers.IntegerField(min_value=0, max_value=2**63 - 1, required=False, allow_null=True,
                                          default=None, help_text="with a file: checked against what arrives")
    checksum_sha256 = serializers.CharField(max_length=64, required=False, allow_blank=True, default="",
                                            help_text="with a file: checked against what arrives")
    description = serializers.CharField(required=False, allow_blank=True, default="")

    def validate(self, attrs):
        if bool(attrs.get("uri")) == bool(attrs.get("file")):
            raise serializers.ValidationError({"uri": ["give either a uri or a file, not both or neither"]})
        return attrs
