from django.contrib import admin

from webapp.accounts.admin import TeamScoped, TeamScopedAdmin
from webapp.registry.models import Entry, Version


class VersionInline(TeamScoped, admin.TabularInline):  # type: ignore[type-arg]  # not subscriptable at runtime
    model = Version
    extra = 0
    fields = ["source_hash", "name", "signature", "created_at"]
    readonly_fields = fields  # type: ignore[assignment]  # a flat list of names
    can_delete = False


@admin.register(Entry)
class EntryAdmin(TeamScopedAdmin):
    list_display = ["name", "kind", "import_path", "team", "status", "inspected_at"]
    list_filter = ["kind", "status"]
    search_fields = ["name", "import_path"]
    readonly_fields = ["current_version", "error", "inspected_at"]
    inlines = [VersionInline]


@admin.register(Version)
class VersionAdmin(TeamScopedAdmin):
    list_display = ["name", "source_hash", "entry", "created_at"]
    readonly_fields = ["entry", "source_hash", "name", "signature", "docstring", "schema", "resource", "module_file"]
