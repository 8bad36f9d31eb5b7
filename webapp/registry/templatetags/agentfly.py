import json
import re
from typing import Any

from django import template
from django.utils.html import escape
from django.utils.safestring import mark_safe

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON for schemas and configs (autoescaped by the template like any string)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


@register.filter
def duration(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{s}s"


@register.filter
def sorted_items(value: dict[str, Any]) -> list[tuple[str, Any]]:
    """A metrics dict in name order, so related metrics (eval/..., time/...) sit together."""
    return sorted(value.items())


@register.filter
def get_item(value: Any, key: str) -> Any:
    """``mapping|get_item:"eval/accuracy"``: a key a template cannot spell with dots (None when absent)."""
    return value.get(key) if isinstance(value, dict) else None


@register.filter
def breakable(value: Any) -> str:
    """A long dotted or slashed name (``agentfly.tools.builtin.calculator:calculator``, a checkpoint path)
    escaped, with a line-break opportunity after each ``.``, ``:``, ``/`` and ``_``: a narrow column wraps it
    between its parts, never one letter per line."""
    text = str(escape("" if value is None else value))
    return mark_safe(re.sub(r"([.:/_])", r"\1<wbr>", text))  # escaped above; the <wbr> are ours


@register.simple_tag
def builtin_entry(kind: str, name: str) -> int | str:
    """The id of the built-in registry entry ``kind``/``name`` (so an example such as the API token page's
    launch command runs as pasted), or ``ID`` where there is none."""
    from webapp.registry.models import Entry

    pk = Entry.objects.filter(team__isnull=True, kind=kind, name=name).values_list("pk", flat=True).first()
    return "ID" if pk is None else int(pk)
