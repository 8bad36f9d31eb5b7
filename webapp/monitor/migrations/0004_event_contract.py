"""Stored events brought to the one event contract of ``trainer.events``, for readers that rely on it.

- ``status`` events the web app wrote by hand left out ``message`` when there was none; ``StatusData``
  always has it, so they get an empty one.
- ``resources`` events stored before the payload was typed (``ResourcesData``: ``host``, ``engine``,
  ``pools``) held the host's figures at the top level (the trainer's ``resource_stats``: ``cpu_percent``,
  ``rss_mb``, ``gpu``, ...) or under ``worker`` (the web app's sampler). They are moved under ``host``
  with the names ``host_stats`` gives them; a figure the old payload did not have is null (a gap).
"""

from django.db import migrations

HOST_KEYS = ("host", "pid", "cpu_count", "cpu_percent", "process_cpu_percent", "process_rss_mb", "threads",
             "memory_used_mb", "memory_total_mb", "memory_percent")


def _gpu(old, index):
    used, total = old.get("memory_used_mb"), old.get("memory_total_mb")
    percent = old.get("memory_percent", round(100.0 * used / total, 1) if used is not None and total else None)
    return {"index": old.get("index", index), "name": old.get("name", ""), "util_percent": old.get("util_percent"),
            "memory_used_mb": used, "memory_total_mb": total, "memory_percent": percent}


def typed_resources(data):
    """The ``ResourcesData`` of an old ``resources`` payload."""
    old = data.get("worker") if isinstance(data.get("worker"), dict) else data
    host = {k: old.get(k) for k in HOST_KEYS}
    if host["process_rss_mb"] is None:
        host["process_rss_mb"] = old.get("rss_mb")
    gpus = old.get("gpus", old.get("gpu")) or []
    host["gpus"] = [_gpu(g, i) for i, g in enumerate(gpus) if isinstance(g, dict)]
    host["gpu_absent"] = old.get("gpu_absent")
    engine = data.get("engine")
    pools = data.get("pools")
    return {"host": host, "engine": engine if isinstance(engine, dict) else {},
            "pools": pools if isinstance(pools, dict) else {}}


def to_the_contract(apps, schema_editor):
    JobEvent = apps.get_model("monitor", "JobEvent")
    for event in JobEvent.objects.filter(type="status").exclude(data__has_key="message").iterator():
        event.data = {**event.data, "message": ""}
        event.save(update_fields=["data"])
    for event in JobEvent.objects.filter(type="resources").exclude(data__has_key="host").iterator():
        event.data = typed_resources(event.data)
        event.save(update_fields=["data"])


class Migration(migrations.Migration):

    dependencies = [
        ('monitor', '0003_job_note'),
    ]

    operations = [
        migrations.RunPython(to_the_contract, migrations.RunPython.noop),
    ]
