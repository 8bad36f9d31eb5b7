from django.apps import AppConfig


class MonitorConfig(AppConfig):
    name = "webapp.monitor"
    label = "monitor"
    verbose_name = "Monitoring"
