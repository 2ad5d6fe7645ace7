"""reclaim_within_cohort gains "Any" (Kueue's reclaimWithinCohort: Never, LowerPriority, Any), the new default.

Before this migration the scheduler ignored both preemption policies and always behaved as within queue
"LowerPriority", reclaim "Any". Stored queues keep that behaviour: their "LowerPriority" reclaim (the old default, the
only value the console ever showed unless an operator chose "Never") becomes "Any"; "Never" stays "Never".
"""

from django.db import migrations, models


def keep_the_behaviour(apps, schema_editor):
    ClusterQueue = apps.get_model("quotas", "ClusterQueue")
    ClusterQueue.objects.filter(reclaim_within_cohort="LowerPriority").update(reclaim_within_cohort="Any")


def back(apps, schema_editor):
    ClusterQueue = apps.get_model("quotas", "ClusterQueue")
    ClusterQueue.objects.filter(reclaim_within_cohort="Any").update(reclaim_within_cohort="LowerPriority")


class Migration(migrations.Migration):

    dependencies = [
        ("quotas", "0001_initial"),
    ]

    operations = [
        migrations.AlterField(
            model_name="clusterqueue",
            name="reclaim_within_cohort",
            field=models.CharField(choices=[("Never", "Never"), ("LowerPriority", "Lower priority"),
                                            ("Any", "Any priority")], default="Any", max_length=16),
        ),
        migrations.RunPython(keep_the_behaviour, back),
    ]
