"""The JSON schema ``@tool`` derives from a signature and its docstring, one supported hint at a time."""

from __future__ import annotations

import enum
from typing import Any, Literal, Optional

import pydantic
import pytest

from agentfly.tools import SchemaError, parse_docstring, tool, type_schema


def params(t: Any) -> dict[str, Any]:
    return t.schema["function"]["parameters"]


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Point(pydantic.BaseModel):
    x: int
    y: int = 0


class Polygon(pydantic.BaseModel):
    name: str
    points: list[Point]


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (list, {"type": "array"}),
        (dict, {"type": "object"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list[list[str]], {"type": "array", "items": {"type": "array", "items": {"type": "string"}}}),
        (set[float], {"type": "array", "items": {"type": "number"}}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (tuple[int, str], {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
                           "minItems": 2, "maxItems": 2}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (dict[str, list[bool]], {"type": "object",
                                 "additionalProperties": {"type": "array", "items": {"type": "boolean"}}}),
        (Optional[int], {"type": ["integer", "null"]}),  # noqa: UP045 - the Optional spelling is what is tested
        (str | None, {"type": ["string", "null"]}),
        (list[int] | None, {"type": ["array", "null"], "items": {"type": "integer"}}),
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (int | str | None, {"anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]}),
        (Literal["add", "sub"], {"type": "string", "enum": ["add", "sub"]}),
        (Literal[1, 2, 3], {"type": "integer", "enum": [1, 2, 3]}),
        (Literal["a", 1], {"enum": ["a", 1]}),
        (Color, {"type": "string", "enum": ["red", "green"]}),
        (Level, {"type": "integer", "enum": [1, 2]}),
        (Any, {}),
    ],
    ids=repr,
)
def test_it_describes_each_supported_hint(hint: Any, expected: dict[str, Any]) -> None:
    assert type_schema(hint) == expected


def test_it_inlines_nested_pydantic_models_without_refs_or_titles() -> None:
    schema = type_schema(Polygon)
    assert schema == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "points": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
                    "required": ["x"],
                },
            },
        },
        "required": ["name", "points"],
    }
    assert "$ref" not in str(schema) and "$defs" not in str(schema)


def test_it_builds_an_openai_function_schema_with_descriptions_defaults_and_required() -> None:
    @tool
    def search(query: str, k: int = 5, color: Color = Color.GREEN, tags: list[str] | None = None,
               mode: Literal["fast", "exact"] = "fast") -> str:
        """Search the corpus.

        Finds passages nearest to the query.

        Args:
            query: What to look for.
            k (int): How many results
                to return, at most.
            color: A colour.

        Returns:
            The passages, one per line.
        """
        return query

    assert search.schema["type"] == "function"
    fn = search.schema["function"]
    assert fn["name"] == "search"
    assert fn["description"] == "Search the corpus.\n\nFinds passages nearest to the query."
    assert fn["parameters"] == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "k": {"type": "integer", "description": "How many results to return, at most.", "default": 5},
            "color": {"type": "string", "enum": ["red", "green"], "description": "A colour.", "default": "green"},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
            "mode": {"type": "string", "enum": ["fast", "exact"], "default": "fast"},
        },
        "required": ["query"],
    }


def test_it_accepts_pydantic_model_parameters_and_passes_validated_models() -> None:
    @tool
    def area(shape: Polygon) -> int:
        return len(shape.points)

    assert params(area)["properties"]["shape"]["properties"]["points"]["items"]["required"] == ["x"]
    assert area.validate({"shape": {"name": "tri", "points": [{"x": 1}, {"x": 2, "y": 3}]}}) == {
        "shape": Polygon(name="tri", points=[Point(x=1), Point(x=2, y=3)])
    }


def test_it_hides_the_context_parameter_from_the_schema() -> None:
    @tool
    def whoami(context: Any, loud: bool = False) -> str:
        """Say which rollout this is.

        Args:
            context: The rollout context (injected).
            loud: Shout.
        """
        return str(context)

    assert whoami.takes_context
    assert list(params(whoami)["properties"]) == ["loud"]
    assert params(whoami)["required"] == []
    assert "context" not in str(whoami.schema)


def test_it_treats_an_unannotated_parameter_as_any_value() -> None:
    @tool
    def echo(value) -> str:  # type: ignore[no-untyped-def]
        return str(value)

    assert params(echo)["properties"] == {"value": {}}
    assert echo.validate({"value": [1, "x"]}) == {"value": [1, "x"]}


class Opaque:
    pass


@pytest.mark.parametrize(
    ("make", "param", "hint_text"),
    [
        (lambda: (lambda blob: None, {"blob": bytes}), "blob", "bytes"),
        (lambda: (lambda lookup: None, {"lookup": dict[int, str]}), "lookup", "dict[int, str]"),
        (lambda: (lambda thing: None, {"thing": Opaque}), "thing", "Opaque"),
        (lambda: (lambda items: None, {"items": list[Opaque]}), "items", "Opaque"),
        (lambda: (lambda maybe: None, {"maybe": Opaque | None}), "maybe", "Opaque"),
    ],
    ids=["bytes", "dict-with-int-keys", "plain-class", "list-of-plain-class", "optional-plain-class"],
)
def test_it_rejects_unsupported_hints_naming_the_parameter(make: Any, param: str, hint_text: str) -> None:
    fn, annotations = make()
    fn.__annotations__ = annotations
    fn.__name__ = fn.__qualname__ = "broken_tool"
    with pytest.raises(SchemaError) as err:
        tool(fn)
    assert f"parameter '{param}'" in str(err.value)
    assert "broken_tool" in str(err.value)
    assert hint_text in str(err.value)


def test_it_rejects_star_args_and_star_kwargs_naming_them() -> None:
    def spread(*values: int) -> int:
        return sum(values)

    def options(**flags: bool) -> str:
        return ""

    with pytest.raises(SchemaError, match="'values'"):
        tool(spread)
    with pytest.raises(SchemaError, match="'flags'"):
        tool(options)


def test_it_rejects_unresolvable_forward_references_naming_the_function() -> None:
    def lookup(key: NoSuchType) -> str:  # type: ignore[name-defined]  # noqa: F821
        return ""

    with pytest.raises(SchemaError, match="lookup"):
        tool(lookup)


def test_it_parses_google_style_docstrings() -> None:
    summary, args = parse_docstring(
        """Run code.

        Second paragraph.

        Args:
            code (str): The program,
                continued here.
            *extra: Ignored positional values.
            timeout: Seconds.

        Raises:
            ValueError: never described as a parameter.
        """
    )
    assert summary == "Run code.\n\nSecond paragraph."
    assert args == {"code": "The program, continued here.", "extra": "Ignored positional values.", "timeout": "Seconds."}
    assert parse_docstring(None) == ("", {})
    assert parse_docstring("Only a summary.") == ("Only a summary.", {})
