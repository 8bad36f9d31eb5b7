"""What users do to the registry: register an entry (and queue its inspection). Views and the API call these.

What workers report back (a description, a failure, the built-ins) is ``webapp.registry.worker``.
"""

from __future__ import annotations

from django.db import transaction

from webapp.accounts.models import Team
from webapp.registry.models import Entry, EntryStatus, Kind, check_import_path
from webapp.registry.rules import check_registrable
from webapp.registry.tasks import inspect_entry


def do_register_entry(*, user: object, team: Team, kind: str, import_path: str) -> Entry:
    """Register ``import_path`` for ``team`` and queue its inspection on a worker.

    Registering the same path twice returns the existing entry and inspects it again (a new version is
    recorded if its source changed), so a double submit or a retried API call is harmless. A path the
    registry's rule refuses raises NotRegistrable (the form and the API show it on the field first).
    """
    if kind not in Kind.values:
        raise ValueError(f"Unknown registry kind: {kind!r}; expected 'tool' or 'reward'")
    import_path = check_import_path(import_path)
    if not team.has_member(user):
        raise PermissionError("you can only register entries for a team you belong to")
    check_registrable(kind, import_path, team.slug)
    with transaction.atomic():
        entry, _ = Entry.objects.get_or_create(
            team=team, kind=kind, import_path=import_path,
            defaults={"created_by": user, "status": EntryStatus.PENDING},
        )
        Entry.objects.filter(pk=entry.pk).update(status=EntryStatus.PENDING, error="")
        entry.status, entry.error = EntryStatus.PENDING, ""
        transaction.on_commit(lambda: queue_inspection(entry.pk))
    return entry


def queue_inspection(entry_id: int) -> None:
    # On the try queue, beside "try it" (both run a team's code in a child, under the same rule): a training
    # job never holds the worker that answers a registration.
    inspect_entry.apply_async(args=[entry_id], queue="try")
