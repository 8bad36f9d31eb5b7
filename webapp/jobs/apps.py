from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "webapp.jobs"
    label = "jobs"
    verbose_name = "Training jobs"

    def ready(self) -> None:
        from webapp.jobs import signals  # noqa: F401  (connects the worker start-up sweep)
