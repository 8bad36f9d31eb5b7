"""What workers report to the registry: an entry's description or failure, the built-ins, refused rows.

``webapp.registry.tasks`` (and ``webapp.jobs.worker``, recording the versions a job imported) call these;
nothing here imports the tasks or the user-side actions, so the two sides never import each other.
"""

from __future__ import annotations

from dataclasses import asdict

from django.db import IntegrityError, transaction
from django.utils import timezone

from webapp.registry.models import Entry, EntryStatus, Version
from webapp.registry.rules import NotRegistrable, check_registrable


def record_description(entry_id: int, description: object) -> Version | None:
    """Store what a worker found at the entry's path as its current version."""
    fields = asdict(description)  # type: ignore[call-overload]
    with transaction.atomic():
        entry = Entry.objects.select_for_update().filter(pk=entry_id).first()
        if entry is None:  # deleted while the worker was importing it
            return None
        version, created = Version.objects.get_or_create(
            entry=entry, source_hash=fields.pop("source_hash"), defaults=fields
        )
        if not created and fields["resource"] and not version.resource:
            # A reward's resource (a judge) was not recorded before; the same source declares the same one.
            version.resource = fields["resource"]
            version.save(update_fields=["resource"])
        entry.current_version = version
        entry.name = version.name
        entry.status = EntryStatus.READY
        entry.error = ""
        entry.inspected_at = timezone.now()
        entry.save(update_fields=["current_version", "name", "status", "error", "inspected_at"])
    return version


def record_failure(entry_id: int, error: str) -> None:
    Entry.objects.filter(pk=entry_id).update(status=EntryStatus.FAILED, error=error, inspected_at=timezone.now())


def ensure_builtin(kind: str, import_path: str) -> Entry:
    """The built-in entry for ``import_path``, created if missing; safe when many workers start at once."""
    try:
        with transaction.atomic():
            entry, _ = Entry.objects.get_or_create(team=None, kind=kind, import_path=import_path)
    except IntegrityError:  # another worker created it between our read and our insert
        entry = Entry.objects.get(team=None, kind=kind, import_path=import_path)
    return entry


def fail_unregistrable_entries() -> list[int]:
    """Mark failed, with the reason, every stored entry the rule refuses (rows made in the admin, a shell,
    or before the rule existed); a worker runs this when it starts. Returns their ids."""
    refused = []
    for entry in Entry.objects.exclude(status=EntryStatus.FAILED).select_related("team").iterator():
        try:
            check_registrable(entry.kind, entry.import_path, entry.team.slug if entry.team else None)
        except NotRegistrable as exc:
            record_failure(entry.pk, str(exc))
            refused.append(entry.pk)
    return refused
