"""OpenAPI schema pieces: the error responses every operation can give, documented once.

drf-spectacular documents the success responses a view declares; the errors DRF itself answers (a bad
field, no token, another team's object, a throttle) are the same shapes everywhere, so a postprocessing hook
adds them to each operation rather than repeating them on every view.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers

DETAIL = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
# A validation error maps each field (or "detail" / "non_field_errors") to its messages; a list field's
# messages are keyed by the item's index, and the launch form's carry a code beside the message.
VALIDATION = {"type": "object", "additionalProperties": {}, "description": "Messages by field name."}


class DetailSerializer(serializers.Serializer[Any]):
    detail = serializers.CharField()


def detail_response(description: str) -> OpenApiResponse:
    return OpenApiResponse(DetailSerializer, description=description)


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def document_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """Add 400/401/403/404/415/429 to every operation that does not document them already."""
    for path, methods in result.get("paths", {}).items():
        for operation in methods.values():
            responses = operation.setdefault("responses", {})
            errors = {
                "400": _json(VALIDATION, "Bad input; each message names its field."),
                "401": _json(DETAIL, "No or an invalid token."),
                "403": _json(DETAIL, "Not allowed (a session request without its CSRF token, for example)."),
                "429": _json(DETAIL, "Too many requests; retry after the time the message says."),
            }
            if "{" in path:
                errors["404"] = _json(DETAIL, "No such object among your teams'.")
            if "requestBody" in operation:
                errors["415"] = _json(DETAIL, "Send JSON (application/json) or a form.")
            for code, response in errors.items():
                responses.setdefault(code, response)
    return result
