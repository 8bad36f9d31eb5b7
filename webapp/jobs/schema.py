"""The launch settings the trainer's config declares for the web app, and every face built from them.

A field of ``trainer.config`` with ``web=Web(...)`` in its metadata is a launch setting: this module walks the
config once (``SETTINGS``) and derives from each its launch form field (``form_fields``), its REST API field
(``serializer_fields``, and through it the OpenAPI schema), the config keys it fills (``config_from``), the value
a cloned job's form opens with (``initial_from``), the form field of a ``ConfigError``'s key (``FIELD_OF_KEY``)
and the page's rule for when it is shown (``Setting.show_if``, which ``static/js/launch.js`` reads from the
page). A new setting is one edit: a field in ``trainer/config.py`` with its help, bounds and ``web``.

What stays in ``webapp.jobs.forms`` is what the config cannot say: fields that are not one config key (the
model's source, the task's file, the judge's place), choices from the database (registry entries, MCP tools,
servers), and the rules that need it (allowed paths, team resources, quotas).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from django import forms
from django.core.exceptions import ValidationError
from rest_framework import serializers

from trainer.config import BOUNDS, DEFAULT, Config, Web, bound_error, choice_error


@dataclass(frozen=True)
class Setting:
    """One config field the web app exposes (``Web``), read from its declaration."""

    key: str  # the dotted config key: "optim.lr"
    name: str  # the form and API field: "learning_rate"
    type: Any  # the declared type less None: int, float, str, bool, a Literal, a list of a Literal
    nullable: bool  # None is a value of the field
    default: Any  # the config's default
    help: str
    metadata: Any  # the dataclass field's metadata: help, bounds, web
    web: Web

    @property
    def choices(self) -> tuple[Any, ...]:
        """The values of a ``Literal`` field (or of a list's items), else ()."""
        tp = typing.get_args(self.type)[0] if typing.get_origin(self.type) is list else self.type
        return typing.get_args(tp) if typing.get_origin(tp) is Literal else ()

    @property
    def many(self) -> bool:
        return typing.get_origin(self.type) is list

    @property
    def initial(self) -> Any:
        return self.default if self.web.initial == DEFAULT else self.web.initial

    @property
    def blank(self) -> Any:
        """What an empty optional field means."""
        return self.default if self.web.blank == DEFAULT else self.web.blank

    @property
    def bounds(self) -> dict[str, float]:
        return {b: self.metadata[b] for b in BOUNDS if b in self.metadata}

    @property
    def keys(self) -> tuple[str, ...]:
        """Every config key the field fills: its own, then ``Web.also``."""
        return (self.key, *self.web.also)

    def check(self, value: Any) -> None:
        """The config's own bound on ``value``, with the config's message (the form and the API say what the
        trainer would say)."""
        message = bound_error(self.key, value, self.metadata)
        if message is not None:
            raise ValidationError(message, code="bound")


def settings_of(cls: type = Config, prefix: str = "") -> list[Setting]:
    """Every field of ``cls`` and its sections (in declaration order) that carries ``web``."""
    found: list[Setting] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            found += settings_of(tp, f"{prefix}{f.name}.")
            continue
        web = f.metadata.get("web")
        if web is None:
            continue
        args = typing.get_args(tp)
        nullable = typing.get_origin(tp) in (types.UnionType, typing.Union) and type(None) in args
        plain = next(a for a in args if a is not type(None)) if nullable else tp
        factory = f.default_factory
        default = f.default if f.default is not dataclasses.MISSING else factory() if callable(factory) else None
        key = prefix + f.name
        found.append(Setting(key=key, name=web.name or key.replace(".", "_"), type=plain, nullable=nullable,
                             default=default, help=web.help or f.metadata.get("help", ""), metadata=f.metadata,
                             web=web))
    return found


SETTINGS: tuple[Setting, ...] = tuple(settings_of())
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
# A ``ConfigError``'s key -> the form field that sets it (``Web.also`` keys too).
FIELD_OF_KEY: dict[str, str] = {key: s.name for s in SETTINGS for key in s.keys}
# Declarations that cannot work, refused when the web app starts (the message names the field to change).
if len(BY_NAME) != len(SETTINGS):  # two settings under one form name would fill each other's value
    raise ImportError(f"two config fields share a web name: {sorted(s.name for s in SETTINGS)}; give one "
                      "another Web(name=...)")
for _s in SETTINGS:
    if _s.web.section is None and not (_s.web.optional or _s.many or _s.type is bool):
        raise ImportError(f"{_s.key}: a setting of the REST API only must be optional (Web(None, optional=True)): "
                          "the launch page never posts it")


def _choice_label(s: Setting, value: Any) -> str:
    return s.web.choice_labels.get(value, "" if value is None else str(value))


def show_if(s: Setting) -> str:
    """The page's rule of ``s`` as the JSON ``launch.js`` reads (``data-show-if``), or "" (always shown)."""
    return json.dumps({k: list(v) for k, v in s.web.show_if.items()}) if s.web.show_if else ""


class SettingChoiceField(forms.ChoiceField):
    """A choice of a setting, refused with the config's own message (and its suggestion of a near choice)."""

    def __init__(self, setting: Setting, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.setting = setting

    def validate(self, value: Any) -> None:
        forms.Field.validate(self, value)  # required; the choice is checked here
        if value not in self.empty_values and not self.valid_value(value):
            raise ValidationError(choice_error(self.setting.key, value, self.setting.choices), code="invalid_choice")


def form_field(s: Setting) -> forms.Field:
    """The launch form's field of ``s``: its type, choices, bounds (the config's, with its messages), label,
    help and initial value; optional fields may be left empty (``Setting.blank``)."""
    common: dict[str, Any] = {"label": s.web.label, "help_text": s.help, "initial": s.initial,
                              "required": not (s.web.optional or s.many or s.type is bool)}
    field: forms.Field
    if s.many and s.choices:
        field = forms.MultipleChoiceField(choices=[(c, _choice_label(s, c)) for c in s.choices],
                                          widget=forms.CheckboxSelectMultiple, **common)
    elif s.choices:
        blank = [("", _choice_label(s, None))] if s.nullable else []
        field = SettingChoiceField(s, choices=[*blank, *((c, _choice_label(s, c)) for c in s.choices)], **common)
        if s.nullable and common["initial"] is None:
            field.initial = ""
    elif s.type is bool:
        field = forms.BooleanField(**common)
    elif s.type in (int, float):
        attrs = {"min": s.bounds.get("ge", s.bounds.get("gt")), "max": s.bounds.get("le", s.bounds.get("lt"))}
        widget = forms.NumberInput(attrs={k: v for k, v in attrs.items() if v is not None})
        kind = forms.IntegerField if s.type is int else forms.FloatField
        field = kind(widget=widget, validators=[s.check], **common)
    else:
        field = forms.CharField(**common)
    field.show_if = show_if(s)  # type: ignore[union-attr]  # rendered as data-show-if (templates/_field.html)
    return field


def form_fields() -> dict[str, forms.Field]:
    return {s.name: form_field(s) for s in SETTINGS}


def section_names(section: str) -> list[str]:
    """The settings of the launch form's ``section``, in declaration order."""
    return [s.name for s in SETTINGS if s.web.section == section]


def serializer_field(s: Setting) -> serializers.Field[Any, Any, Any, Any]:
    """The REST API's field of ``s``, for the OpenAPI schema (the launch form validates): required fields
    default to their initial value, optional ones may be left out (they then mean ``Setting.blank``)."""
    common: dict[str, Any] = {"help_text": s.help}
    if s.web.optional or s.many or s.type is bool:
        common |= {"required": False, "allow_null": s.nullable and not s.choices}
    else:
        common["default"] = s.initial
    if s.many and s.choices:
        return serializers.ListField(child=serializers.ChoiceField(choices=list(s.choices)), **common)
    if s.choices:
        return serializers.ChoiceField(choices=list(s.choices), allow_blank=s.nullable, **common)
    if s.type is bool:
        return serializers.BooleanField(**common)
    if s.type in (int, float):
        b = s.bounds
        kind = serializers.IntegerField if s.type is int else serializers.FloatField
        # An open bound (gt, lt) is told in the help; OpenAPI's minimum is the closed one.
        open_bounds = [f"{'more' if k == 'gt' else 'less'} than {v}" for k, v in b.items() if k in ("gt", "lt")]
        if open_bounds:
            common["help_text"] = f"{s.help} ({', '.join(open_bounds)})"
        return kind(min_value=b.get("ge"), max_value=b.get("le"), **common)  # type: ignore[arg-type]  # an int's are ints
    return serializers.CharField(allow_blank=True, **common)


def serializer_fields() -> dict[str, serializers.Field[Any, Any, Any, Any]]:
    return {s.name: serializer_field(s) for s in SETTINGS}


def fill_blanks(cleaned: dict[str, Any]) -> None:
    """An optional setting left empty takes its ``blank`` value (a launch that predates the field, or a page
    that leaves it empty, launches as before it existed)."""
    for s in SETTINGS:
        if s.web.optional and cleaned.get(s.name) in (None, "") and s.name in cleaned:
            cleaned[s.name] = s.blank


def put(config: dict[str, Any], key: str, value: Any) -> None:
    """Set the dotted ``key`` in the nested ``config``, making its sections."""
    *sections, last = key.split(".")
    node = config
    for part in sections:
        node = node.setdefault(part, {})
    node[last] = value


def _get(config: dict[str, Any], key: str) -> tuple[bool, Any]:
    """(whether the section of ``key`` is in ``config``, the value at ``key`` or its absence as ``DEFAULT``)."""
    *sections, last = key.split(".")
    node: Any = config
    for part in sections:
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            return False, DEFAULT
    return True, node.get(last, DEFAULT)


def config_from(cleaned: dict[str, Any]) -> dict[str, Any]:
    """The config keys of the settings in ``cleaned`` (the form's cleaned data), as a nested mapping. An empty
    choice ("") is the field's None; a None value is left out (the config's default, which is None)."""
    config: dict[str, Any] = {}
    for s in SETTINGS:
        value = cleaned.get(s.name)
        if s.choices and not s.many and value == "":
            value = None
        if value is None and s.nullable:
            continue
        if s.many:
            value = list(value or [])
        for key in s.keys:
            put(config, key, value)
    return config


def initial_from(config: dict[str, Any]) -> dict[str, Any]:
    """The form values of the settings a job ran with (``config`` as stored): a key left out ran at the
    config's default, except in a section the job has not at all (a job without ``sft`` is not a warm start:
    its warm-start fields keep the form's starting values)."""
    initial: dict[str, Any] = {}
    for s in SETTINGS:
        present, value = _get(config, s.key)
        if not present:
            continue
        if value == DEFAULT:
            value = s.default
        if s.choices and not s.many and value is None:
            value = ""
        if value is not None:
            initial[s.name] = list(value) if s.many else value
    return initial
