from django.contrib import admin

from webapp.accounts.admin import TeamScopedAdmin
from webapp.monitor.models import JobEvent


@admin.register(JobEvent)
class JobEventAdmin(TeamScopedAdmin):
    list_display = ["job", "seq", "type", "step", "time"]
    list_filter = ["type"]
    readonly_fields = ["job", "seq", "type", "step", "time", "data"]
