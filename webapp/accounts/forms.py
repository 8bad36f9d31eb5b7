from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UserCreationForm
from django.contrib.auth.models import Group


class InvitedSignupForm(UserCreationForm):  # type: ignore[type-arg]  # not subscriptable at runtime
    """Sign-up through an invitation: the user joins the invitation's team, so there is no team to name."""

    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username",)


class SignupForm(InvitedSignupForm):
    team_name = forms.CharField(
        max_length=80, required=False,
        help_text="Create a team and join it. Leave empty to get a personal team; others can invite you to theirs.",
    )

    def clean_team_name(self) -> str:
        name: str = self.cleaned_data.get("team_name", "").strip()
        if name and Group.objects.filter(name=name).exists():
            raise forms.ValidationError(f"A team named {name!r} already exists; ask one of its members to invite you.")
        return name


class TeamForm(forms.Form):
    name = forms.CharField(max_length=80)

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"].strip()
        if not name:
            raise forms.ValidationError("Give the team a name.")
        if Group.objects.filter(name=name).exists():
            raise forms.ValidationError(f"A team named {name!r} already exists; pick another name.")
        return name


class AddMemberForm(forms.Form):
    """Invite an existing user by name; they become a member only by accepting."""

    username = forms.CharField(max_length=150)

    def clean_username(self) -> str:
        return str(self.cleaned_data["username"]).strip()
