from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "webapp.accounts"
    label = "accounts"
    verbose_name = "Accounts and teams"

    def ready(self) -> None:
        from webapp.accounts import signals  # noqa: F401  (connects the receivers)
