"""decode_json (orjson, with json.loads where orjson would differ) returns exactly what json.loads returns."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cortex._validate import decode_json, encode_json

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    # around orjson's exact range (signed and unsigned 64-bit)
    | st.integers(min_value=-(2**64) - 5, max_value=2**64 + 5)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(lambda t: "\x00" not in t)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=5).filter(lambda t: "\x00" not in t), inner, max_size=4)
    ),
    max_leaves=10,
)


def _same(got: Any, expected: Any) -> bool:
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        return repr(got) == repr(expected)  # -0.0 keeps its sign
    if isinstance(expected, list):
        return len(got) == len(expected) and all(map(_same, got, expected))
    if isinstance(expected, dict):
        return got.keys() == expected.keys() and all(_same(got[k], expected[k]) for k in expected)
    return bool(got == expected)


@settings(max_examples=500)
@given(_VALUES)
def test_decodes_as_json_loads(value: Any) -> None:
    text = encode_json(value, 1 << 20)
    assert _same(decode_json(text), json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        '""',
        '"abc"',
        '"ünï"',
        '"a\\"b"',
        '"a\\\\b"',
        '"\\u0000"',
        '"\\n"',
        "0",
        "7",
        "123",
        "-5",
        "1.5",
        "1e16",
        "-0.0",
        "true",
        "false",
        "null",
        "[1,2]",
        '{"a":1}',
        "12345678901234567890",
        "-0",
        "1E5",
        "0.5e-3",
        "1e400",
        "-12.75",
        "1764500000.123456",
        # integers at and past the 64-bit edges, alone and inside documents
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "123456789012345678901234567890",
        '{"a":[1,-99999999999999999999]}',
        '{"n":18446744073709551616}',
        "9007199254740993",
        # floats at the edges of the double range and of precision
        "5e-324",
        "2.2250738585072014e-308",
        "1.7976931348623157e308",
        "0.1000000000000000055511151231257827",
        "1e-400",
        "-1e400",
        # text orjson refuses and json.loads takes
        '"\\ud800"',
        '["\\udfff", "x"]',
        '{"a":1,"a":2}',
    ],
)
def test_edge_texts(text: str) -> None:
    assert _same(decode_json(text), json.loads(text))


def _reference_encode(value: Any, max_bytes: int) -> str:
    """encode_json as it was before its fast path: json.dumps, then the walk every time."""
    from cortex._validate import _check_keys_and_strings

    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if len(text.encode()) > max_bytes:
        raise ValueError("too large")
    _check_keys_and_strings(value)
    return text


_KEYS = (
    st.text(alphabet=st.sampled_from("ab\\u0\x00é"), max_size=4)
    | st.integers(-3, 3)
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False, allow_infinity=False)
)
_HOSTILE = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(alphabet=st.sampled_from("ab\\u0\x00é\ud800"), max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner, inner)
        | st.dictionaries(_KEYS, inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=800)
@given(_HOSTILE)
def test_encode_refuses_exactly_what_the_walk_refuses(value: Any) -> None:
    """The fast path (no NUL escape in the text, orjson accepts the keys) changes no answer."""
    try:
        expected: str | None = _reference_encode(value, 1 << 20)
    except (TypeError, ValueError, RecursionError):
        expected = None
    try:
        got: str | None = encode_json(value, 1 << 20)
    except ValueError:
        got = None
    assert got == expected


@settings(max_examples=300)
@given(st.text().filter(lambda t: "\x00" not in t), _VALUES)
def test_state_size_counts_the_stored_pair(key: str, value: Any) -> None:
    """encode_data counts a key and its text (json.encoder.encode_basestring each) as their compact object."""
    from json.encoder import encode_basestring as _json_string

    if not key:
        return
    try:
        text = encode_json(value, 1 << 20)
        pair = encode_json({key: text}, 1 << 22)
    except ValueError:
        return  # not storable: encode_data refuses it before counting
    counted = len(_json_string(key).encode()) + len(_json_string(text).encode()) + 3
    assert counted == len(pair.encode())


_DIGITS_AND_MORE = st.text(
    alphabet=st.sampled_from("0123456789") | st.characters(codec="utf-8") | st.just("\ud800"),
    max_size=80,
)


@settings(max_examples=1000)
@given(_DIGITS_AND_MORE)
def test_the_digit_run_scan_is_the_regular_expression(text: str) -> None:
    from cortex._validate import has_long_digit_run

    assert has_long_digit_run(text) == (re.search("[0-9]{19}", text) is not None)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("1" * 18, False),
        ("1" * 19, True),
        ("x" + "9" * 19 + "x", True),
        ("1" * 18 + "ü" + "1" * 18, False),
        ("\u0661" * 30, False),  # Arabic-Indic digits are not [0-9]
        ("\ud800" + "0" * 19, True),
    ],
)
def test_the_digit_run_scan_at_its_edges(text: str, found: bool) -> None:
    from cortex._validate import has_long_digit_run

    assert has_long_digit_run(text) is found


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=8), _VALUES, max_size=6))
def test_a_state_document_decodes_as_json_loads_twice(document: dict[str, Any]) -> None:
    """The outer object without the number scan: what json.loads, then each value's, gives."""
    from cortex._calls.rows import decode_data

    stored = json.dumps({key: encode_json(value, 1 << 20) for key, value in document.items()})
    expected = {key: json.loads(value) for key, value in json.loads(stored).items()}
    assert _same(decode_data(stored), expected)


def test_a_state_document_with_a_lone_surrogate_key_decodes() -> None:
    from cortex._calls.rows import decode_data

    assert decode_data('{"\\ud800": "18446744073709551616"}') == {"\ud800": 2**64}
