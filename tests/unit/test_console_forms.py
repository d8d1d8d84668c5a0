"""Response schema -> answer form, and a submitted form -> the JSON answer (cortex.server.forms)."""

from __future__ import annotations

from typing import Any

from cortex.server.forms import Field, errors_by_field, fields_for, parse_form

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean", "description": "pay it"},
        "amount": {"type": "integer", "minimum": 0, "maximum": 499},
        "ratio": {"type": "number"},
        "team": {"enum": ["billing", "support"]},
        "priority": {"oneOf": [{"const": 1, "title": "high"}, {"const": 2, "title": "low"}]},
        "email": {"type": "string", "format": "email", "minLength": 3, "maxLength": 50},
        "code": {"type": "string", "pattern": "^[A-Z]{3}$", "default": "ABC"},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "gift": {"type": "boolean"}},
            },
            "minItems": 1,
        },
        "extra": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    },
    "required": ["approved", "amount", "team"],
}


def by_label(f: Field) -> dict[str, Field]:
    return {c.label: c for c in f.children}


def test_each_kind_of_schema_becomes_its_control() -> None:
    form = fields_for(SCHEMA)
    assert form.kind == "object"
    fields = by_label(form)
    assert fields["approved"].kind == "checkbox"
    assert fields["approved"].description == "pay it"
    assert fields["amount"].kind == "integer"
    assert fields["amount"].attrs == {"step": "1", "min": "0", "max": "499"}
    assert fields["amount"].required
    assert fields["ratio"].attrs == {"step": "any"}
    assert fields["team"].kind == "select"
    assert [o[0] for o in fields["team"].options] == ["", "billing", "support"]
    assert fields["priority"].options == [("", ""), ("high", "1"), ("low", "2")]
    assert fields["email"].input_type == "email"
    assert fields["email"].attrs == {"minlength": "3", "maxlength": "50"}
    assert fields["code"].value == "ABC"
    assert "pattern" in fields["code"].attrs
    assert fields["address"].kind == "object"
    assert by_label(fields["address"])["city"].required
    assert fields["items"].kind == "array"
    assert len(fields["items"].children) == 3  # one required row and two spare
    assert fields["extra"].kind == "json"
    assert fields["items"].children[0].children[0].name == "f/items/0/sku"


def test_a_schema_the_form_cannot_express_is_a_json_textarea() -> None:
    for schema in ({"$ref": "#/$defs/x"}, {"type": ["string", "null"]}, True, {}):
        assert fields_for(schema).kind == "json"
    assert fields_for({"type": "string"}).label == "answer"


def test_a_submission_reads_back_as_json() -> None:
    form = fields_for(SCHEMA)
    parsed = parse_form(
        form,
        {
            "f/approved": "true",
            "f/amount": "42",
            "f/ratio": "0.5",
            "f/team": '"billing"',
            "f/priority": "1",
            "f/email": "",
            "f/code": "XYZ",
            "f/address/city": "Oslo",
            "f/address/zip": "",
            "f/items/0/sku": "A1",
            "f/items/1/sku": "",
            "f/items/2/sku": "C3",
            "f/items/2/gift": "true",
            "f/extra": "7",
        },
    )
    assert not parsed.errors
    assert parsed.value == {
        "approved": True,
        "amount": 42,
        "ratio": 0.5,
        "team": "billing",
        "priority": 1,
        "code": "XYZ",
        "address": {"city": "Oslo"},
        "items": [{"sku": "A1", "gift": False}, {"sku": "C3", "gift": True}],
        "extra": 7,
    }
    # The third row became the answer's second item: its errors go to row 3's controls.
    assert parsed.sources[("items", 1, "sku")] == "f/items/2/sku"


def test_unparsed_text_is_kept_for_the_schema_to_name() -> None:
    form = fields_for(SCHEMA)
    parsed = parse_form(form, {"f/amount": "many", "f/team": '"billing"', "f/extra": "{nope"})
    assert parsed.value["amount"] == "many"
    assert "f/extra" in parsed.errors
    assert parsed.value["approved"] is False  # an unticked checkbox is false


def test_errors_land_beside_the_field_they_name() -> None:
    form = fields_for(SCHEMA)
    parsed = parse_form(form, {"f/amount": "900", "f/address/zip": "1", "f/items/0/sku": "A"})
    errors, general = errors_by_field(SCHEMA, parsed)
    assert not general
    assert "f/amount" in errors  # maximum
    assert "f/team" in errors  # required, missing
    assert "f/address/city" in errors  # required inside a nested object
    assert "f/approved" not in errors


def _depth(f: Field) -> int:
    return 1 + max((_depth(child) for child in f.children), default=0)


def test_a_form_is_bounded_in_depth_and_in_parts() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(30):
        deep = {"type": "object", "properties": {"x": deep}}
    form = fields_for(deep)
    assert _depth(form) <= 9
    leaf = form
    while leaf.children:
        leaf = leaf.children[0]
    # What lies deeper is answered as JSON.
    assert leaf.kind == "json"
    assert parse_form(form, {leaf.name: '{"x": "y"}'}).errors == {}
    # Options count too: 20 rows of a 100-choice enum would be 2,000 of them.
    rows = {"type": "array", "minItems": 20, "items": {"enum": list(range(100))}}
    whole = fields_for(rows)
    assert (whole.kind, whole.children) == ("json", [])
    assert fields_for({**rows, "minItems": 5}).kind == "array"


def test_json_nested_too_deeply_is_an_error_of_its_field() -> None:
    form = fields_for({"type": "object", "properties": {"raw": {"anyOf": [{}]}}})
    parsed = parse_form(form, {"f/raw": "[" * 5000 + "]" * 5000})
    assert "f/raw" in parsed.errors


def test_a_remote_reference_is_refused_not_fetched() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "http://127.0.0.1:9/x.json"}}}
    parsed = parse_form(fields_for(schema), {"f/a": "1"})
    by_field, general = errors_by_field(schema, parsed)
    assert by_field == {}
    assert len(general) == 1
    assert "only local references" in general[0]
