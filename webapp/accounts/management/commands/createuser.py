"""``manage.py createuser NAME --team TEAM --password-stdin``: a user and their team, for a new deployment
(or a script) without the sign-up page. The password is read from standard input, so it never appears in a
process list or a shell history:

    echo "$PASSWORD" | docker compose exec -T web python manage.py createuser alice --team "Team A" --password-stdin
"""

from __future__ import annotations

import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from webapp.accounts.models import Team, do_create_team


class Command(BaseCommand):
    help = "Create a user and add them to a team (created when it does not exist)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument("--team", required=True,
                            help="The team's name; made with the user as first member and admin.")
        parser.add_argument("--admin", action="store_true",
                            help="Make the user an admin of an existing team too (a new team's creator always is).")
        parser.add_argument("--password-stdin", action="store_true",
                            help="Read the password from standard input (without it the user cannot sign in).")

    def handle(self, *args: Any, username: str, team: str, password_stdin: bool, admin: bool = False,
               **options: Any) -> None:
        User = get_user_model()
        password = sys.stdin.readline().rstrip("\n") if password_stdin else None
        if User.objects.filter(username=username).exists():
            raise CommandError(f"a user named {username!r} already exists; pick another name")
        user = User(username=username)
        if password is not None:
            try:
                validate_password(password, user)
            except ValidationError as exc:
                raise CommandError("password refused: " + " ".join(exc.messages)) from None
        with transaction.atomic():
            user.set_password(password) if password is not None else user.set_unusable_password()
            user.save()
            existing = Team.objects.filter(group__name=team).first()
            if existing is None:
                joined = do_create_team(team, user)
            else:
                existing.add_member(user, admin=admin)
                joined = existing
        role = "admin" if joined.is_admin(user) else "member"
        self.stdout.write(f"created user {username} in team {joined.slug} ({role})")
