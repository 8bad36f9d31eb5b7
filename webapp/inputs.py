"""Input rules shared by every page form and REST endpoint: bad input is a 400 naming the field, never a 500.

Three kinds of input used to reach the database or the JSON decoder and crash there:

- text PostgreSQL cannot store: NUL (``\\x00``) and lone UTF-16 surrogates (``"\\ud800"`` in JSON) make
  psycopg raise on encode, and ``\\u0000`` in a jsonb value is refused by the server;
- JSON nested thousands deep: Python's ``json`` recurses and raises ``RecursionError``;
- integers beyond what PostgreSQL's ``bigint`` holds in ``?limit=`` / ``?offset=`` / ``?after=``.

``SafeJSONParser`` (the API's JSON parser), ``loads`` (JSON typed into a form) and ``query_int`` (query
parameters) refuse each of them with a message, before anything is decoded, stored or queried.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import serializers
from rest_framework.exceptions import ParseError
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.parsers import FormParser, JSONParser, MultiPartParser
from rest_framework.utils import json as drf_json

# Strings first, so brackets inside them do not count; the unrolled loop is linear (no backtracking).
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_UNSTORABLE = re.compile(r"[\x00\ud800-\udfff]")
_DEPTH_STEP = str.maketrans({"[": "+", "{": "+", "]": "-", "}": "-"})
PG_BIGINT_MAX = 2**63 - 1


class JSONInputError(ValueError):
    """JSON the app will not decode or store; ``path`` is where in the document (``[]`` for the whole)."""

    def __init__(self, message: str, path: list[str | int] | None = None) -> None:
        super().__init__(message)
        self.path = path or []


def max_json_depth() -> int:
    return int(getattr(settings, "AGENTFLY_MAX_JSON_DEPTH", 64))


def json_depth(text: str) -> int:
    """How deeply ``text``'s arrays and objects nest, without recursing (valid JSON or not)."""
    brackets = re.sub(r"[^\[\]{}]", "", _JSON_STRING.sub("", text)).translate(_DEPTH_STEP)
    return max(accumulate(1 if c == "+" else -1 for c in brackets), default=0)


def unstorable(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text``, or None."""
    match = _UNSTORABLE.search(text)
    if match is None:
        return None
    if match.group() == "\x00":
        return "contains a NUL character (\\u0000), which cannot be stored; remove it"
    return (f"contains a lone surrogate (\\u{ord(match.group()):04x}), which is not a character and cannot be "
            "stored; send text as valid UTF-8")


def check_storable(value: Any) -> None:
    """Raise ``JSONInputError`` at the first key or string in ``value`` that cannot be stored (no recursion)."""
    stack: list[tuple[list[str | int], Any]] = [([], value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            reason = unstorable(item)
            if reason:
                raise JSONInputError(f"This value {reason}.", path)
        elif isinstance(item, dict):
            for key, child in item.items():
                reason = unstorable(str(key))
                if reason:
                    raise JSONInputError(f"The key {key.encode('unicode_escape').decode()!r} {reason}.", [*path, key])
                stack.append(([*path, key], child))
        elif isinstance(item, list):
            stack.extend(([*path, i], child) for i, child in enumerate(item))


def loads(text: str) -> Any:
    """``json.loads`` that refuses deep nesting and text that cannot be stored (``JSONInputError``)."""
    limit = max_json_depth()
    if json_depth(text) > limit:
        raise JSONInputError(f"JSON nested too deeply: at most {limit} levels of arrays and objects "
                             "(AGENTFLY_MAX_JSON_DEPTH).")
    value = drf_json.loads(text)
    check_storable(value)
    return value


class SafeJSONParser(JSONParser):
    """DRF's JSON parser with a size cap, a depth cap and a refusal of unstorable text, each a 400."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        cap = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        raw = stream.read(cap + 1 if cap is not None else -1) if stream is not None else b""
        if cap is not None and len(raw) > cap:
            raise ParseError(f"The request body is larger than {cap} bytes (DATA_UPLOAD_MAX_MEMORY_SIZE).")
        try:
            return loads(raw.decode(encoding))
        except JSONInputError as exc:
            raise as_api_error(exc) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


def as_api_error(exc: JSONInputError) -> Exception:
    """The DRF error for ``exc``: on the top-level key the client sent (the field), else on the body."""
    if not exc.path:
        return ParseError(str(exc))
    inside = "".join(f"[{p!r}]" for p in exc.path[1:])  # where inside the field, for nested JSON
    return serializers.ValidationError({str(exc.path[0]): [f"{inside} {exc}".strip()]})


def _check_form_data(data: Any) -> None:
    # A form-encoded or multipart body cannot carry a lone surrogate (Django decodes with replacement), but
    # it can carry %00, which PostgreSQL refuses in any text it is asked to compare or store.
    values = data.data if hasattr(data, "data") else data  # MultiPartParser returns DataAndFiles
    try:
        check_storable({key: values.getlist(key) for key in values})
    except JSONInputError as exc:
        raise as_api_error(JSONInputError(str(exc), exc.path[:1])) from None


class SafeFormParser(FormParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _check_form_data(data)
        return data


class SafeMultiPartParser(MultiPartParser):
    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        _check_form_data(data)
        return data


def exception_handler(exc: Exception, context: dict[str, Any]) -> Any:
    """DRF's handler, plus Django's refusal of an oversized body as a 400 that names the setting."""
    # Imported here: rest_framework.views reads DEFAULT_PARSER_CLASSES, which names this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        exc = ParseError(f"The request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes "
                         "(DATA_UPLOAD_MAX_MEMORY_SIZE).")
    return drf_exception_handler(exc, context)


def query_int(params: Any, name: str, default: int, low: int, high: int) -> int:
    """The integer query parameter ``name`` within [low, high]; ``ValueError`` says what to send."""
    raw = params.get(name, "")
    if raw in ("", None):
        return default
    raw = str(raw).strip()
    # isdecimal, not isdigit: "²" is a digit that int() refuses. A length cap keeps int() cheap.
    value = int(raw) if len(raw) <= 20 and raw.lstrip("-").isdecimal() and raw.count("-") <= 1 else None
    if value is None or not low <= value <= high:
        raise ValueError(f"{name}={raw[:40]!r}: give an integer from {low} to {high}.")
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    """``?limit=`` and ``?offset=`` refused with a 400 outside their range (DRF's own pass any size to SQL)."""

    max_limit = 500
    max_offset = 10**9

    def _param(self, request: Any, name: str, default: int, low: int, high: int) -> int:
        try:
            return query_int(request.query_params, name, default, low, high)
        except ValueError as exc:
            raise serializers.ValidationError({name: [str(exc)]}) from None

    def get_limit(self, request: Any) -> int:
        return self._param(request, self.limit_query_param, self.default_limit, 1, self.max_limit)  # type: ignore[arg-type]  # 500

    def get_offset(self, request: Any) -> int:
        return self._param(request, self.offset_query_param, 0, 0, self.max_offset)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        params = super().get_schema_operation_parameters(view)
        bounds = {self.limit_query_param: (1, self.max_limit), self.offset_query_param: (0, self.max_offset)}
        for p in params:
            low, high = bounds[p["name"]]
            p["schema"].update({"minimum": low, "maximum": high})
        return params
