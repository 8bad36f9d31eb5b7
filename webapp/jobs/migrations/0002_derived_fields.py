from django.db import migrations


class Migration(migrations.Migration):
    """``celery_task_id`` and ``total_steps`` are derived from the id and the config (model properties now)."""

    dependencies = [
        ("jobs", "0001_initial"),
    ]

    operations = [
        migrations.RemoveField(model_name="trainingjob", name="celery_task_id"),
        migrations.RemoveField(model_name="trainingjob", name="total_steps"),
    ]
