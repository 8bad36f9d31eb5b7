from __future__ import annotations

from typing import Any, cast

from django import forms

from webapp.accounts.models import Team
from webapp.registry.models import Kind, check_import_path
from webapp.registry.rules import NotRegistrable, check_registrable


class RegisterForm(forms.Form):
    kind = forms.ChoiceField(choices=Kind.choices)
    import_path = forms.CharField(
        max_length=300, widget=forms.TextInput(attrs={"placeholder": "my_tools.search:web_search"}),
        help_text="module:function of a function decorated with @tool or @reward, in a plugin folder (your "
                  "team's own modules: agentfly_teams.<team>.<module>:function), AgentFly's built-ins or "
                  "AGENTFLY_TOOL_PACKAGES.")
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team = cast("forms.ModelChoiceField[Team]", self.fields["team"])
        team.queryset = Team.objects.of(user).select_related("group")

    def clean_import_path(self) -> str:
        try:
            return check_import_path(self.cleaned_data["import_path"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("import_path") and data.get("kind") and data.get("team"):
            try:
                check_registrable(data["kind"], data["import_path"], data["team"].slug)
            except NotRegistrable as exc:
                self.add_error("import_path", str(exc))
        return data


class TryForm(forms.Form):
    arguments = forms.CharField(widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}), initial="{}",
                                help_text="The arguments as a JSON object, as the model would send them.")

    def clean_arguments(self) -> dict[str, Any]:
        from webapp.registry.tasks import parse_arguments

        try:
            return parse_arguments(self.cleaned_data["arguments"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
