"""JSON schema from a Python signature and its docstring, and argument validation against it.

The schema is the OpenAI function-calling shape (``{"type": "object", "properties": ..., "required": ...}``),
built from type hints; parameter descriptions come from a Google-style ``Args:`` section. Validation goes
through a pydantic model built from the same signature, so what the schema promises is what is checked.
"""

from __future__ import annotations

import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

import pydantic

# Parameters the runtime injects; they never appear in a schema.
INJECTED_PARAMETERS = frozenset({"context"})

_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


class SchemaError(TypeError):
    """A signature that cannot be described as a JSON schema (the message names the parameter)."""


class ArgumentError(ValueError):
    """Arguments that do not match a tool's schema (the message names each bad field)."""


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {parameter: description})."""
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    lines = doc.splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        header = re.fullmatch(r"(Args|Arguments|Parameters|Returns|Raises|Yields|Examples?|Notes?):", stripped)
        if header:
            section = header.group(1)
            current = None
            continue
        if section in ("Args", "Arguments", "Parameters"):
            m = re.match(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
            if m and (line.startswith((" ", "\t")) or not summary):
                current = m.group(1).lstrip("*")
                params[current] = m.group(2).strip()
            elif current and stripped:
                params[current] = f"{params[current]} {stripped}".strip()
        elif section is None:
            summary.append(line)
    return "\n".join(summary).strip(), params


def _enum_type(values: Sequence[object]) -> dict[str, object]:
    kinds = {_JSON_TYPES.get(type(v)) for v in values}
    return {"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {}


def _inline_refs(schema: Any, defs: Mapping[str, Any]) -> Any:
    if isinstance(schema, dict):
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return _inline_refs(defs[name], defs)
        return {k: _inline_refs(v, defs) for k, v in schema.items() if k not in ("title", "$defs")}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


def type_schema(hint: Any, where: str = "value") -> dict[str, object]:
    """The JSON schema of one type hint. ``where`` names the parameter in error messages."""
    if hint is inspect.Parameter.empty or hint is Any:
        return {}
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if hint is type(None):
        return {"type": "null"}
    if hint in (list, tuple, set, frozenset):
        return {"type": "array"}
    if hint is dict:
        return {"type": "object"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        values = [m.value for m in hint]
        return {**_enum_type(values), "enum": values}
    if isinstance(hint, type) and issubclass(hint, pydantic.BaseModel):
        raw: dict[str, Any] = hint.model_json_schema()
        inlined: dict[str, Any] = _inline_refs(raw, raw.get("$defs", {}))
        return inlined
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Literal:
        return {**_enum_type(args), "enum": list(args)}
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        nullable = len(options) < len(args)
        if len(options) == 1:
            inner = type_schema(options[0], where)
            if nullable and isinstance(inner.get("type"), str):
                return {**inner, "type": [inner["type"], "null"]}
            return {"anyOf": [inner, {"type": "null"}]} if nullable else inner
        schemas = [type_schema(a, where) for a in options] + ([{"type": "null"}] if nullable else [])
        return {"anyOf": schemas}
    if origin in (list, tuple, set, frozenset, Sequence, typing.Sequence):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [type_schema(a, where) for a in args],
                    "minItems": len(args), "maxItems": len(args)}
        return {"type": "array", "items": type_schema(args[0], where)} if args else {"type": "array"}
    if origin in (dict, Mapping, typing.Mapping):
        if len(args) == 2:
            if args[0] is not str:
                raise SchemaError(f"{where}: JSON object keys are strings; use dict[str, ...] instead of {hint!r}")
            return {"type": "object", "additionalProperties": type_schema(args[1], where)}
        return {"type": "object"}
    raise SchemaError(
        f"{where}: type hint {hint!r} has no JSON schema; use str, int, float, bool, list[...], dict[str, ...], "
        "Optional, Literal, an Enum or a pydantic model"
    )


def signature_schema(fn: Callable[..., Any]) -> tuple[str, dict[str, object], type[pydantic.BaseModel], bool]:
    """Describe ``fn``: (description, parameters schema, validator model, takes_context).

    Raises SchemaError naming the parameter whose hint cannot be described.
    """
    description, param_docs = parse_docstring(fn.__doc__)
    try:
        hints = typing.get_type_hints(fn, include_extras=False)
    except Exception as exc:  # unresolvable forward references
        raise SchemaError(f"{fn.__qualname__}: cannot resolve type hints ({exc})") from exc
    sig = inspect.signature(fn)
    properties: dict[str, dict[str, object]] = {}
    required: list[str] = []
    fields: dict[str, Any] = {}
    takes_context = False
    for name, param in sig.parameters.items():
        if name in INJECTED_PARAMETERS:
            takes_context = True
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise SchemaError(f"{fn.__qualname__}: parameter '{name}': *args/**kwargs cannot be described to a model")
        hint = hints.get(name, param.annotation)
        schema = type_schema(hint, where=f"{fn.__qualname__}: parameter '{name}'")
        if name in param_docs:
            schema = {**schema, "description": param_docs[name]}
        if param.default is inspect.Parameter.empty:
            required.append(name)
            fields[name] = (Any if hint is inspect.Parameter.empty else hint, ...)
        else:
            default = param.default
            if isinstance(default, enum.Enum):
                schema["default"] = default.value
            elif default is None or isinstance(default, (str, int, float, bool, list, dict)):
                schema["default"] = default
            fields[name] = (Any if hint is inspect.Parameter.empty else hint, default)
        properties[name] = schema
    parameters: dict[str, object] = {"type": "object", "properties": properties, "required": required}
    validator = pydantic.create_model(
        f"{fn.__name__}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=True),
        **fields,
    )
    return description, parameters, validator, takes_context


def validate_arguments(tool_name: str, validator: type[pydantic.BaseModel], arguments: Any) -> dict[str, Any]:
    """Check ``arguments`` against the tool's signature; return them converted to the declared types."""
    if not isinstance(arguments, dict):
        raise ArgumentError(
            f"arguments for tool '{tool_name}' must be a JSON object, got {type(arguments).__name__}: {arguments!r}"
        )
    try:
        model = validator.model_validate(arguments)
    except pydantic.ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(arguments)"
            msg = "unexpected argument" if err["type"] == "extra_forbidden" else err["msg"]
            given = f" (got {err['input']!r})" if err["type"] not in ("missing", "extra_forbidden") else ""
            problems.append(f"{loc}: {msg}{given}")
        raise ArgumentError(f"invalid arguments for tool '{tool_name}': " + "; ".join(problems)) from None
    # Keep pydantic models as models, everything else as converted plain values.
    return {name: getattr(model, name) for name in type(model).model_fields}
