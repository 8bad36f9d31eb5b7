from django.apps import AppConfig


class AlertsConfig(AppConfig):
    name = "webapp.alerts"
    label = "alerts"
    default_auto_field = "django.db.models.BigAutoField"
