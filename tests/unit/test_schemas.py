"""Response schemas: refused when asked if answers could not be checked safely.

No database: these exercise cortex._schemas through the public models.
"""

from __future__ import annotations

from typing import Any

import pytest

from cortex import InvalidInput, RequestedInput
from cortex._schemas import MAX_SCHEMA_DEPTH, check_response_schema, validate_response

REDOS = {"type": "string", "pattern": "^(a+)+$"}


def ask(schema: Any) -> RequestedInput:
    return RequestedInput(interrupt_id="q", response_schema=schema)


def test_a_backtracking_pattern_is_checked_in_linear_time() -> None:
    # Python's re takes about 2**n steps here (14 s at n = 28 when measured);
    # the linear engine answers at once for n = 60,000.
    ask(REDOS)
    with pytest.raises(InvalidInput, match="does not match"):
        validate_response("a" * 60_000 + "!", REDOS)
    validate_response("a" * 60_000, REDOS)


def test_patterns_on_property_names_are_linear_too() -> None:
    schema = {
        "type": "object",
        "patternProperties": {"^(a+)+$": {"type": "integer"}},
        "additionalProperties": False,
    }
    ask(schema)
    with pytest.raises(InvalidInput, match="response"):
        validate_response({"a" * 30_000 + "!": 1}, schema)
    validate_response({"a" * 30_000: 1}, schema)


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "string", "pattern": "(?<=a)b"}, "regex"),  # lookbehind: backtracking only
        ({"type": "string", "pattern": "(a)\\1"}, "regex"),  # backreference
        ({"$ref": "#"}, "loops"),
        ({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "loops"),
        (
            {
                "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]}, "b": {"$ref": "#/$defs/a"}},
                "$ref": "#/$defs/a",
            },
            "loops",
        ),
        ({"$ref": "#/nope"}, "points to nothing"),
        ({"$ref": "https://example.com/schema.json"}, "only local"),
        ({"$ref": "#anchor"}, "only local"),
        ({"$dynamicRef": "#x"}, "not supported"),
        ({"type": 12}, "not a valid JSON Schema at type"),
        ({"$schema": "https://example.com/meta"}, "not a valid JSON Schema"),
    ],
)
def test_unsafe_or_broken_schemas_are_refused_when_asked(schema: Any, why: str) -> None:
    with pytest.raises(InvalidInput, match=why):
        ask(schema)


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("depth", [200, 5_000])
def test_deep_schemas_are_refused_not_crashed(depth: int) -> None:
    with pytest.raises(InvalidInput, match="response_schema"):
        ask(_nested(depth))


def test_reasonably_deep_schemas_are_fine() -> None:
    schema = _nested(MAX_SCHEMA_DEPTH // 2 - 1)
    ask(schema)


def test_exponential_sharing_through_defs_is_refused() -> None:
    # 60 bytes a level, and each level doubles the work: 2**40 subschemas.
    defs: dict[str, Any] = {
        f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]}
        for i in range(40)
    }
    defs["d40"] = {"type": "string"}
    with pytest.raises(InvalidInput, match="too complex"):
        ask({"$defs": defs, "$ref": "#/$defs/d0"})


def test_recursion_through_the_answer_is_fine() -> None:
    tree = {
        "type": "object",
        "properties": {
            "label": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#"}},
        },
        "required": ["label"],
    }
    ask(tree)
    validate_response(
        {"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]}, tree
    )
    with pytest.raises(InvalidInput, match="children/0/children/0"):
        validate_response({"label": "a", "children": [{"label": "b", "children": [{}]}]}, tree)


def test_a_pydantic_style_schema_with_defs_validates() -> None:
    schema = {
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {"sku": {"type": "string"}},
                "required": ["sku"],
            }
        },
        "type": "object",
        "properties": {
            "approved": {"type": "boolean"},
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        },
        "required": ["approved"],
    }
    ask(schema)
    validate_response({"approved": True, "items": [{"sku": "x"}]}, schema)
    with pytest.raises(
        InvalidInput, match=r"response: at approved: \"yes\" is not of type \"boolean\""
    ):
        validate_response({"approved": "yes"}, schema)


def test_validation_work_is_bounded() -> None:
    wide = {
        "type": "array",
        "items": {
            "anyOf": [{"type": "string", "minLength": i} for i in range(3_000)]
            + [{"type": "integer"}]
        },
    }
    check_response_schema(wide)
    validate_response([1] * 100, wide)
    with pytest.raises(InvalidInput, match="too large to check"):
        validate_response([1] * 30_000, wide)
