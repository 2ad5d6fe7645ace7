"""Cancelled jobs from before 2026-12-07 count as released: since then a cancelled job's devices count as in use until
its stop marks the run `stopped` (jobs.admission.RUN_RELEASED), and the runs of older cancelled jobs were stopped
then (or are stopped by the orphan reconciler, which marks them too)."""

from django.db import migrations, models


def mark_released(apps, schema_editor):
    TrainingJob = apps.get_model("jobs", "TrainingJob")
    TrainingJob.objects.filter(state="CANCELLED").exclude(compute_handle="").exclude(runtime_state="stopped") \
        .update(runtime_state="stopped")


class Migration(migrations.Migration):

    dependencies = [
        ("jobs", "0007_preemption_hold"),
    ]

    operations = [
        migrations.RunPython(mark_released, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="trainingjob",
            name="waits_for",
            field=models.JSONField(blank=True, default=list, help_text="ids of preempted, shrunk or cancelled jobs "
                                   "whose runs still hold devices this admission was given (checkpointing, stopping): "
                                   "it launches once they are gone"),
        ),
    ]
