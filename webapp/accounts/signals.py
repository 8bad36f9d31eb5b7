"""A password change revokes the user's API tokens.

Their other sessions end by Django's own rule: a session stores a hash of the password it signed in with,
and ``django.contrib.auth`` refuses a session whose hash no longer matches (the view that changed the password
keeps its own session with ``update_session_auth_hash``). An API token has no such link to the password, so
whoever set a new password (the user, a superuser, a staff member of all the user's teams) would otherwise leave
a stolen token working.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models.signals import pre_save
from django.dispatch import receiver


@receiver(pre_save, sender=get_user_model(), dispatch_uid="revoke-tokens-on-password-change")
def revoke_tokens_on_password_change(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    if raw or instance.pk is None:
        return
    stored = sender.objects.filter(pk=instance.pk).values_list("password", flat=True).first()
    if stored is None or stored == instance.password:
        return
    # Django re-hashes a password at sign-in when its hasher's settings changed: the same password, so the
    # tokens stay. That save (check_password's setter) writes only the password and clears the raw one that
    # set_password() leaves on the instance; every password-changing form keeps it until its save.
    update_fields = kwargs.get("update_fields")
    if getattr(instance, "_password", None) is None and update_fields is not None and set(update_fields) == {"password"}:
        return
    from rest_framework.authtoken.models import Token

    Token.objects.filter(user_id=instance.pk).delete()
