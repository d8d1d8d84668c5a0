"""The console's answer forms: a response schema as form fields, a submitted form as JSON.

:func:`fields_for` turns a pending input's ``response_schema`` into a tree
of :class:`Field` (strings, numbers, booleans, enums, objects, arrays of
those); a subschema the form cannot express (``anyOf``, ``$ref``, a type
list, ...) becomes a raw-JSON textarea. :func:`parse_form` reads a
submission back into the JSON answer and remembers which control each
value came from, so :func:`errors_by_field` can put a validation error
beside the field it names. The HTML attributes a field carries are a hint
to the browser; ``Store.resume``'s check against the schema is the rule.
This module renders nothing and never touches the database.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import jsonschema_rs

from cortex._schemas import response_errors
from cortex.errors import InvalidInput

__all__ = [
    "ROOT_LABEL",
    "Field",
    "Parsed",
    "errors_by_field",
    "fields_for",
    "parse_form",
    "refill",
]

Path = tuple[str | int, ...]
Kind = Literal["text", "number", "integer", "checkbox", "select", "object", "array", "json"]

# The label of a response that is not an object (it has no property name).
ROOT_LABEL: Final = "answer"
# Form control names start here, so they never collide with the form's own fields.
_PREFIX: Final = "f"
# Empty rows an array offers beyond its defaults (a form without script cannot add rows).
_SPARE_ROWS: Final = 2
_MAX_ROWS: Final = 20
# Controls and select options one form may hold: rows of nested arrays multiply,
# so a few hundred bytes of schema would otherwise describe millions of them.
_MAX_PARTS: Final = 1000
# Objects and arrays nested in one form; a subschema deeper is a raw-JSON field.
_MAX_DEPTH: Final = 8
# String formats browsers have an input type for whose value is the JSON Schema's.
_INPUT_TYPES: Final = {"email": "email", "uri": "url", "date": "date"}
_UNEXPRESSED: Final = frozenset(
    {"$ref", "allOf", "anyOf", "oneOf", "not", "if", "patternProperties", "dependentSchemas"}
)


@dataclass
class Field:
    """One control (or group of controls) of an answer form."""

    kind: Kind
    # The control's name in the form: "f", "f/approved", "f/items/0/name".
    name: str
    # The schema property name (or "items 2", or ROOT_LABEL): the control's label.
    label: str
    required: bool = False
    description: str = ""
    # HTML attributes for the browser's hint: min, max, step, minlength, maxlength, pattern.
    attrs: dict[str, str] = field(default_factory=dict)
    # <input type> of a text field.
    input_type: str = "text"
    # A select's options: (label, the value as JSON text); "" is "no value".
    options: list[tuple[str, str]] = field(default_factory=list)
    # The initial value: text for inputs, JSON text for selects and textareas.
    value: str = ""
    checked: bool = False
    # An object's properties, or an array's rows.
    children: list[Field] = field(default_factory=list)

    @property
    def dom_id(self) -> str:
        """An id for the control, unique within one form (prefixed per form by the template)."""
        return "".join(c if c.isalnum() else "-" for c in self.name)


def _text(schema: Mapping[str, Any], key: str) -> str:
    value = schema.get(key)
    return value if isinstance(value, str) else ""


def _count(schema: Mapping[str, Any], key: str) -> int | None:
    value = schema.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _name(parent: str, key: str | int) -> str:
    text = str(key).replace("~", "~0").replace("/", "~1")
    return f"{parent}/{text}"


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _constants(schema: Mapping[str, Any]) -> list[tuple[str, Any]] | None:
    """The choices of an enum, a const, or a oneOf/anyOf of consts; None for anything else."""
    if isinstance(schema.get("enum"), list):
        return [(v if isinstance(v, str) else _json(v), v) for v in schema["enum"]]
    if "const" in schema:
        v = schema["const"]
        return [(v if isinstance(v, str) else _json(v), v)]
    for keyword in ("oneOf", "anyOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            if not all(isinstance(b, dict) and "const" in b for b in branches):
                return None
            return [
                (
                    str(b.get("title") or (b["const"] if isinstance(b["const"], str) else "")),
                    b["const"],
                )
                if b.get("title") or isinstance(b["const"], str)
                else (_json(b["const"]), b["const"])
                for b in branches
            ]
    return None


def _raw(name: str, label: str, schema: Any, required: bool, description: str) -> Field:
    default = schema.get("default") if isinstance(schema, dict) else None
    value = "" if default is None else json.dumps(default, ensure_ascii=False, indent=2)
    return Field("json", name, label, required, description, value=value)


class _TooLarge(Exception):
    """The form would hold more than :data:`_MAX_PARTS` controls and options."""


@dataclass
class _Budget:
    """What is left of :data:`_MAX_PARTS` while a form is built."""

    left: int = _MAX_PARTS

    def spend(self, parts: int) -> None:
        self.left -= parts
        if self.left < 0:
            raise _TooLarge


def fields_for(schema: Any) -> Field:
    """The form for a response schema: an object's properties, or one control labelled ``answer``.

    A schema whose form would hold more than 1,000 controls and options
    (arrays of arrays) is answered in one raw-JSON field instead.
    """
    try:
        return _field(schema, _PREFIX, ROOT_LABEL, required=True, budget=_Budget(), depth=0)
    except _TooLarge:
        description = _text(schema, "description") if isinstance(schema, dict) else ""
        return _raw(_PREFIX, ROOT_LABEL, schema, True, description)


def _field(
    schema: Any, name: str, label: str, *, required: bool, budget: _Budget, depth: int
) -> Field:
    budget.spend(1)
    if not isinstance(schema, dict):
        return _raw(name, label, schema, required, "")
    description = _text(schema, "description")
    choices = _constants(schema)
    if choices is not None:
        budget.spend(len(choices))
        options = [(text, _json(v)) for text, v in choices]
        if not required or len(options) > 1:
            options.insert(0, ("", ""))
        default = _json(schema["default"]) if "default" in schema else ""
        return Field("select", name, label, required, description, options=options, value=default)
    if _UNEXPRESSED & schema.keys() or depth >= _MAX_DEPTH:
        return _raw(name, label, schema, required, description)
    kind = schema.get("type")
    if kind == "string":
        return _string(schema, name, label, required, description)
    if kind in ("number", "integer"):
        attrs = {"step": "1" if kind == "integer" else "any"}
        for keyword, attr in (("minimum", "min"), ("maximum", "max")):
            if isinstance(schema.get(keyword), int | float) and not isinstance(
                schema.get(keyword), bool
            ):
                attrs[attr] = str(schema[keyword])
        start = schema.get("default")
        shown = _json(start) if isinstance(start, int | float) else ""
        return Field(kind, name, label, required, description, attrs=attrs, value=shown)
    if kind == "boolean":
        return Field(
            "checkbox", name, label, required, description, checked=schema.get("default") is True
        )
    if kind == "object" and isinstance(schema.get("properties"), dict) and schema["properties"]:
        wanted: list[Any] = schema["required"] if isinstance(schema.get("required"), list) else []
        defaults: dict[str, Any] = (
            schema["default"] if isinstance(schema.get("default"), dict) else {}
        )
        children = []
        for key, sub in schema["properties"].items():
            if isinstance(sub, dict) and "default" not in sub and key in defaults:
                sub = {**sub, "default": defaults[key]}
            children.append(
                _field(
                    sub,
                    _name(name, key),
                    key,
                    required=key in wanted,
                    budget=budget,
                    depth=depth + 1,
                )
            )
        return Field("object", name, label, required, description, children=children)
    if kind == "array" and isinstance(schema.get("items"), dict):
        return _array(schema, name, label, required, description, budget, depth)
    return _raw(name, label, schema, required, description)


def _string(schema: dict[str, Any], name: str, label: str, required: bool, desc: str) -> Field:
    attrs = {}
    for keyword, attr in (("minLength", "minlength"), ("maxLength", "maxlength")):
        if isinstance(schema.get(keyword), int) and not isinstance(schema.get(keyword), bool):
            attrs[attr] = str(schema[keyword])
    if isinstance(schema.get("pattern"), str):
        # The browser anchors a pattern and reads it as JavaScript; a hint only.
        attrs["pattern"] = f".*(?:{schema['pattern']}).*"
    fmt = schema.get("format")
    input_type = _INPUT_TYPES.get(fmt, "text") if isinstance(fmt, str) else "text"
    if isinstance(fmt, str) and input_type == "text":
        attrs["placeholder"] = fmt
    default = schema.get("default")
    value = default if isinstance(default, str) else ""
    return Field(
        "text", name, label, required, desc, attrs=attrs, input_type=input_type, value=value
    )


def _array(
    schema: dict[str, Any],
    name: str,
    label: str,
    required: bool,
    desc: str,
    budget: _Budget,
    depth: int,
) -> Field:
    items = schema["items"]
    defaults: list[Any] = schema["default"] if isinstance(schema.get("default"), list) else []
    low = _count(schema, "minItems") or 0
    high = _count(schema, "maxItems")
    high = _MAX_ROWS if high is None else high
    rows = min(max(low, len(defaults)) + _SPARE_ROWS, high, _MAX_ROWS)
    children = []
    for i in range(rows):
        sub = items
        if i < len(defaults):
            sub = {**items, "default": defaults[i]}
        row = _field(
            sub,
            _name(name, i),
            f"{label} {i + 1}",
            required=False,
            budget=budget,
            depth=depth + 1,
        )
        if row.kind == "checkbox":
            # A row of checkboxes could not be left out: true, false or nothing.
            row = Field(
                "select",
                row.name,
                row.label,
                description=row.description,
                options=[("", ""), ("true", "true"), ("false", "false")],
                value=_json(sub["default"]) if "default" in sub else "",
            )
        children.append(row)
    return Field("array", name, label, required, desc, children=children)


@dataclass
class Parsed:
    """A submission read back: the answer, and where each part of it came from."""

    # The answer; None with ``absent`` when nothing was filled in.
    value: Any
    absent: bool
    # Each value's path in the answer -> the control (or group) it came from.
    sources: dict[Path, str]
    # Controls whose text is not what they hold (JSON that does not parse), by name.
    errors: dict[str, str]


def parse_form(root: Field, form: Mapping[str, str]) -> Parsed:
    """The JSON answer a submitted form holds: empty controls are left out, checkboxes are booleans.

    Numbers that do not parse are kept as text, so the schema's check names
    them; a raw-JSON field that does not parse is an error of that field.
    """
    parsed = Parsed(None, True, {}, {})
    value, present = _read(root, form, (), parsed)
    parsed.value, parsed.absent = value, not present
    return parsed


def _read(f: Field, form: Mapping[str, str], at: Path, out: Parsed) -> tuple[Any, bool]:
    out.sources[at] = f.name
    if f.kind == "checkbox":
        return form.get(f.name) is not None, True
    if f.kind == "object":
        result: dict[str, Any] = {}
        filled = False
        for child in f.children:
            key = child.label
            value, present = _read(child, form, (*at, key), out)
            if present:
                result[key] = value
                # An unticked checkbox alone does not make a spare row an answer.
                filled = filled or not (child.kind == "checkbox" and value is False)
        return result, filled or f.required
    if f.kind == "array":
        rows: list[Any] = []
        for child in f.children:
            value, present = _read(child, form, (*at, len(rows)), out)
            if present and value != {}:
                rows.append(value)
        return rows, bool(rows) or f.required
    text = form.get(f.name, "")
    if text == "":
        return None, False
    if f.kind == "text":
        return text, True
    if f.kind in ("number", "integer"):
        try:
            number = json.loads(text)
        except (ValueError, RecursionError):
            return text, True
        return (number, True) if isinstance(number, int | float) else (text, True)
    try:
        return json.loads(text), True
    except ValueError as exc:
        if f.kind == "json":
            out.errors[f.name] = f"not JSON: {exc}"
        return None, False
    except RecursionError:
        if f.kind == "json":
            out.errors[f.name] = "not JSON cortex takes: nested too deeply"
        return None, False


def errors_by_field(schema: Any, parsed: Parsed) -> tuple[dict[str, list[str]], list[str]]:
    """The schema's errors for the parsed answer, by control name; the rest for the whole form.

    An error is put on the control its instance path came from (a missing
    required property on that property's control), else on its nearest
    ancestor that is a control, else on the form.
    """
    by_field: dict[str, list[str]] = {name: [text] for name, text in parsed.errors.items()}
    general: list[str] = []
    try:
        found = response_errors(parsed.value, schema)
    except InvalidInput as exc:
        return by_field, [str(exc)]
    for error in found:
        path: Path = tuple(error.instance_path)
        missing = getattr(error.kind, "property", None)
        if isinstance(error.kind, jsonschema_rs.ValidationErrorKind.Required) and isinstance(
            missing, str
        ):
            path = (*path, missing)
        name = None
        for n in range(len(path), -1, -1):
            name = parsed.sources.get(path[:n])
            if name is not None:
                break
        if name is None:
            general.append(error.message)
        else:
            by_field.setdefault(name, []).append(error.message)
    return by_field, general


def refill(f: Field, form: Mapping[str, str]) -> None:
    """Put a submission's text back into its controls, so a refused answer is shown as sent."""
    if f.kind == "checkbox":
        f.checked = form.get(f.name) is not None
    elif f.kind in ("object", "array"):
        for child in f.children:
            refill(child, form)
    else:
        f.value = form.get(f.name, "")
