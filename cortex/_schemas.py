"""Response schemas: accepted only when an answer can be checked against them cheaply.

``resume`` validates a human's answer against the JSON Schema the question
carried. Both come from outside (the schema from a host or a model, the
answer from whoever answers), so validation must not be a way to stall the
process. Three bounds make its cost proportional to the inputs:

- **Regular expressions** (``pattern``, ``patternProperties``) run on a
  linear-time engine (jsonschema-rs with Rust's ``regex`` crate): no
  catastrophic backtracking. A pattern that engine cannot run (lookaround,
  backreferences) makes the schema invalid, refused when it is asked.
- **References**: only local ``$ref`` (``#`` or ``#/…`` JSON pointers), never
  fetched. The schema's size with every reference expanded is bounded
  (:data:`MAX_SCHEMA_COST`), so a few bytes of ``anyOf`` over shared
  ``$defs`` cannot describe exponential work; a reference loop that never
  descends into the answer (``{"$ref": "#"}``) is refused, a recursive one
  that does (a tree) is fine.
- **Work**: at ``resume``, schema cost times the answer's number of JSON
  values is bounded (:data:`MAX_VALIDATION_WORK`); beyond it the answer is
  refused with InvalidInput rather than checked.

This module must not import the database layer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from itertools import islice
from typing import Any, Final
from urllib.parse import unquote

import jsonschema_rs

from cortex.errors import InvalidInput

__all__ = [
    "MAX_SCHEMA_COST",
    "MAX_SCHEMA_DEPTH",
    "MAX_VALIDATION_WORK",
    "check_response_schema",
    "response_errors",
    "validate_response",
]

MAX_SCHEMA_DEPTH: Final = 32
"""Nesting of a response schema (objects and arrays)."""
MAX_SCHEMA_COST: Final = 10_000
"""Subschemas of a response schema, counting each ``$ref`` as what it expands to."""
MAX_VALIDATION_WORK: Final = 5_000_000
"""Schema cost times the answer's JSON values: about 0.1 s of validation at worst."""

# Keywords whose subschemas apply to a part of the instance, not to itself: a
# reference loop through one of them consumes the answer and terminates.
_DESCENDING: Final = frozenset(
    {
        "properties",
        "patternProperties",
        "additionalProperties",
        "unevaluatedProperties",
        "propertyNames",
        "items",
        "prefixItems",
        "additionalItems",
        "unevaluatedItems",
        "contains",
    }
)
# Keywords whose values are data, never subschemas.
_DATA: Final = frozenset({"const", "enum", "examples", "default", "required", "$comment"})
# Keywords whose values map names to subschemas.
_MAPS: Final = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies"}
)
_UNSUPPORTED: Final = ("$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, level)
            if deepest > MAX_SCHEMA_DEPTH:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, level + 1) for child in children)
    return deepest


def _resolve(root: dict[str, Any], ref: object) -> tuple[str, Any]:
    if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
        raise InvalidInput(
            f"response_schema: $ref {ref!r}: only local references to '#' or '#/…' are supported"
        )
    node: Any = root
    for raw in ref[2:].split("/") if ref != "#" else []:
        token = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise InvalidInput(f"response_schema: $ref {ref!r} points to nothing")
    return ref, node


def _subschemas(node: dict[str, Any]) -> Iterator[tuple[bool, Any]]:
    """(descends, subschema) for each subschema directly inside ``node``."""
    for key, value in node.items():
        if key in _DATA or key == "$ref":
            continue
        descends = key in _DESCENDING
        if isinstance(value, dict) and key in _MAPS:
            for child in value.values():
                yield descends, child
        elif isinstance(value, dict | bool):
            yield descends, value
        elif isinstance(value, list):
            for child in value:
                if isinstance(child, dict | bool):
                    yield descends, child


def _cost(root: dict[str, Any]) -> int:
    """Subschemas with references expanded; refuses loops that never descend.

    Memoised per reference target, so shared ``$defs`` cost their expanded
    size without being walked once per use.
    """
    memo: dict[str, int] = {}
    # References being expanded, with whether the path since each one entered
    # has descended into the instance.
    open_refs: dict[str, bool] = {}

    def walk(node: Any, depth: int) -> int:
        if depth > MAX_SCHEMA_DEPTH * 4:
            raise InvalidInput("response_schema: references nest too deeply")
        if not isinstance(node, dict):
            return 1
        total = 1
        if "$id" in node and node is not root:
            raise InvalidInput("response_schema: $id is supported only at the root")
        for keyword in _UNSUPPORTED:
            if keyword in node:
                raise InvalidInput(f"response_schema: {keyword} is not supported")
        if "$ref" in node:
            key, target = _resolve(root, node["$ref"])
            if key in open_refs:
                if not open_refs[key]:
                    raise InvalidInput(
                        f"response_schema: $ref {key!r} loops without reaching into the answer"
                    )
                total += 1  # recursion through the answer: paid per level of the answer
            elif key in memo:
                total += memo[key]
            else:
                open_refs[key] = False
                memo[key] = walk(target, depth + 1)
                del open_refs[key]
                total += memo[key]
        for descends, child in _subschemas(node):
            if descends:
                marked = [k for k, seen in open_refs.items() if not seen]
                for k in marked:
                    open_refs[k] = True
                total += walk(child, depth + 1)
                for k in marked:
                    open_refs[k] = False
            else:
                total += walk(child, depth + 1)
            if total > MAX_SCHEMA_COST:
                raise InvalidInput(
                    f"response_schema: too complex to check answers against "
                    f"(more than {MAX_SCHEMA_COST:,} subschemas with references expanded)"
                )
        return total

    return walk(root, 0)


def _path(parts: list[str | int]) -> str:
    return "/".join(str(p) for p in parts) or "(root)"


@lru_cache(maxsize=256)
def _compiled(schema_json: str) -> tuple[jsonschema_rs.Validator, int]:
    schema = json.loads(schema_json)
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        raise InvalidInput(f"response_schema: nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if not isinstance(schema, dict | bool):
        raise InvalidInput("response_schema: a JSON Schema is an object or a boolean")
    cost = _cost(schema) if isinstance(schema, dict) else 1
    try:
        validator = jsonschema_rs.validator_for(
            schema, pattern_options=jsonschema_rs.RegexOptions(), offline=True
        )
    except jsonschema_rs.ValidationError as exc:
        raise InvalidInput(
            f"response_schema: not a valid JSON Schema at {_path(exc.instance_path)}: {exc.message}"
        ) from None
    except (jsonschema_rs.ReferencingError, ValueError) as exc:
        raise InvalidInput(f"response_schema: not a valid JSON Schema: {exc}") from None
    return validator, cost


def _canonical(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except RecursionError:
        # A stored schema no append took (an old row): too deep to even serialise.
        raise InvalidInput(
            f"response_schema: nested deeper than {MAX_SCHEMA_DEPTH} levels"
        ) from None


def check_response_schema(schema: Any) -> Any:
    """Refuse a response schema answers could not be checked against safely; return it.

    Raises:
        InvalidInput: invalid, unsupported (non-local references, lookaround
            patterns, ...), nested too deep or too complex; naming why.
    """
    _compiled(_canonical(schema))
    return schema


def _values(value: Any) -> int:
    count, stack = 0, [value]
    while stack:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def _checked(response: Any, schema: Any) -> jsonschema_rs.Validator:
    """The schema's validator, once the answer is known to be cheap enough to check against it."""
    validator, cost = _compiled(_canonical(schema))
    values = _values(response)
    if cost * values > MAX_VALIDATION_WORK:
        raise InvalidInput(
            f"response: too large to check against its response schema "
            f"({values:,} JSON values x {cost:,} subschemas)"
        )
    return validator


def validate_response(response: Any, schema: Any) -> None:
    """Check an answer against its question's response schema.

    Raises:
        InvalidInput: the answer fails the schema (naming the failing path), or
            checking it would cost more than :data:`MAX_VALIDATION_WORK`.
    """
    validator = _checked(response, schema)
    try:
        validator.validate(response)
    except jsonschema_rs.ValidationError as exc:
        raise InvalidInput(f"response: at {_path(exc.instance_path)}: {exc.message}") from None


def response_errors(
    response: Any, schema: Any, *, limit: int = 100
) -> list[jsonschema_rs.ValidationError]:
    """Every way an answer fails its response schema (at most ``limit``), checked as at ``resume``.

    The one validator :func:`validate_response` uses: local references only,
    never fetched; linear-time patterns; the same bound on work.

    Raises:
        InvalidInput: the schema is one :func:`check_response_schema` refuses,
            or checking the answer would cost more than :data:`MAX_VALIDATION_WORK`.
    """
    return list(islice(_checked(response, schema).iter_errors(response), limit))
