"""The MCP server pages' forms: register a server, try one of its tools. The rule itself is
``webapp.mcpservers.rules``, applied by ``actions.do_register_server``; these only parse what was typed."""

from __future__ import annotations

import shlex
from typing import Any, cast

from django import forms

from webapp.accounts.models import Team
from webapp.mcpservers.models import Transport

TOOL_NAME = r"^[A-Za-z_][\w.-]{0,63}$"


class RegisterServerForm(forms.Form):
    team = forms.ModelChoiceField(queryset=Team.objects.none(), empty_label=None)
    name = forms.SlugField(max_length=60, widget=forms.TextInput(attrs={"placeholder": "kv", "autocomplete": "off"}),
                           help_text="The resource name a job's config asks for (mcp.<name>): letters, digits, '-' "
                                     "and '_'. Registering a name again replaces how the server is started.")
    transport = forms.ChoiceField(choices=Transport.choices, widget=forms.RadioSelect, initial=Transport.STDIO)
    command = forms.CharField(
        max_length=2000, required=False, label="Command (stdio)",
        widget=forms.TextInput(attrs={"placeholder": "kv_server.py --flag", "class": "mono", "autocomplete": "off"}),
        help_text="A .py script in your team's plugin folder, as its path relative to that folder, then its "
                  "arguments (quoted as in a shell); or a command the operator allowlisted.")
    url = forms.CharField(max_length=500, required=False, label="URL (HTTP)",
                          widget=forms.TextInput(attrs={"placeholder": "https://mcp.example.org/mcp",
                                                        "class": "mono", "autocomplete": "off"}),
                          help_text="A streamable-HTTP endpoint on the operator's allowlist (AGENTFLY_MCP_URLS).")
    reset_tool = forms.RegexField(TOOL_NAME, required=False, max_length=64,
                                  help_text="Optional: a tool that forgets a session's state, called between "
                                            "rollouts instead of restarting the server; hidden from the model.")
    seed_tool = forms.RegexField(TOOL_NAME, required=False, max_length=64,
                                 help_text="Optional: a tool called at a rollout's first call with the task "
                                           "sample's fields its input schema names; hidden from the model.")

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team = cast("forms.ModelChoiceField[Team]", self.fields["team"])
        team.queryset = Team.objects.of(user).select_related("group")

    def clean_command(self) -> list[str]:
        try:
            return shlex.split(self.cleaned_data["command"] or "")
        except ValueError as exc:  # an unclosed quote
            raise forms.ValidationError(f"the command cannot be split into arguments ({exc}); close its quotes") \
                from None

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if data.get("transport") == Transport.STDIO and not data.get("command"):
            self.add_error("command", "A stdio server needs a command: the script's path in your team's plugin "
                                      "folder, e.g. kv_server.py")
        if data.get("transport") == Transport.HTTP and not data.get("url"):
            self.add_error("url", "An HTTP server needs its URL, e.g. https://mcp.example.org/mcp")
        return data


class TryServerForm(forms.Form):
    tool = forms.ChoiceField(choices=())
    arguments = forms.CharField(widget=forms.Textarea(attrs={"rows": 4, "class": "mono"}), initial="{}",
                                help_text="The arguments as a JSON object, as the model would send them.")

    def __init__(self, *args: Any, tools: list[dict[str, Any]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cast(forms.ChoiceField, self.fields["tool"]).choices = [(t["name"], t["name"]) for t in tools]

    def clean_arguments(self) -> dict[str, Any]:
        from webapp.registry.tasks import parse_arguments

        try:
            return parse_arguments(self.cleaned_data["arguments"])
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None
