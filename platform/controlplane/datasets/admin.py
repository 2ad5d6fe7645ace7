"""Django admin for datasets and versions."""

from django.contrib import admin

from controlplane.datasets.models import Dataset, DatasetVersion


class DatasetVersionInline(admin.TabularInline):
    model = DatasetVersion
    extra = 0
    readonly_fields = ["version", "uri", "uploaded", "size_bytes", "checksum_sha256", "created_at"]


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "team", "created_at"]
    list_filter = ["team"]
    inlines = [DatasetVersionInline]
