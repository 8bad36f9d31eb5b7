from django.apps import AppConfig


class RegistryConfig(AppConfig):
    name = "webapp.registry"
    label = "registry"
    verbose_name = "Tool and reward registry"

    def ready(self) -> None:
        from webapp.registry import signals  # noqa: F401  (connects worker_ready)
