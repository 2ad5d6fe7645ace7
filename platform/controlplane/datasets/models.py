"""Datasets (named, per team) and their numbered, immutable versions."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.db import models
from django.utils import timezone

from controlplane.common.netguard import uri_without_credentials  # (shown_uri masks with it)
from controlplane.tenancy.models import SLUG_VALIDATOR, Team


class DatasetFormat(models.TextChoices):
    TEXT = "text", "Plain text"
    JSONL = "jsonl", "JSON lines"
    CSV = "csv", "CSV"
    PARQUET = "parquet", "Parquet"
    ARROW = "arrow", "Arrow"
    TAR = "tar", "Tar archive"
    OTHER = "other", "Other"


class Dataset(models.Model):
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="datasets")
    name = models.SlugField(max_length=63, validators=[SLUG_VALIDATOR])
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["team__name", "name"]
        constraints = [models.UniqueConstraint(fields=["team", "name"], name="dataset_unique_per_team")]

    def __str__(self) -> str:
        return f"{self.team}/{self.name}"


class DatasetVersion(models.Model):
    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    version = models.PositiveIntegerField()
    uri = models.CharField(max_length=1000, help_text="where the data lives (s3://, https://, file://)")
    uploaded = models.BooleanField(default=False, help_text="stored in Fleetyard's own storage")
    size_bytes = models.BigIntegerField(null=True, blank=True)
    checksum_sha256 = models.CharField(max_length=64, blank=True)
    format = models.CharField(max_length=16, choices=DatasetFormat.choices, default=DatasetFormat.OTHER)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True,
                                   blank=True, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["dataset__name", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "version"], name="dataset_version_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset}@{self.version}"

    @property
    def shown_uri(self) -> str:
        """`uri` as members see it; jobs still read the stored one. An uploaded file is
        `upload://<team>/<dataset>/v<version>/<file>`: its stored `uri` is a file:// path on the control plane, which
        the API showed as it was (QA). Credentials a version registered before they were refused still holds are
        masked (`https://***@host/x`)."""
        if self.uploaded:
            filename = PurePosixPath(unquote(urlsplit(self.uri).path)).name
            return f"upload://{self.dataset.team.name}/{self.dataset.name}/v{self.version}/{filename}"
        return uri_without_credentials(self.uri)
