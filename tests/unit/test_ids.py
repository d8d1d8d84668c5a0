from __future__ import annotations

import uuid

import pytest

from cortex import InvalidInput
from cortex.ids import format_id, new_uuid, parse_id


def test_round_trip_and_sortable() -> None:
    values = [new_uuid() for _ in range(100)]
    assert all(v.version == 7 for v in values)
    ids = [format_id("ses", v) for v in values]
    assert all(i.startswith("ses_") and len(i) == 30 for i in ids)
    assert [parse_id("ses", i) for i in ids] == values
    assert sorted(ids) == ids  # k-sortable


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ses_",
        "ses_zzzzzzzzzzzzzzzzzzzzzzzzzz",
        "ses_01M8N5V2K0ECC9EHF091KVPG8H",
        "x" * 500,
        "ses_01m8n5v2k0ecc9ehf091kvpg8",
    ],
)
def test_malformed(text: str) -> None:
    with pytest.raises(InvalidInput):
        parse_id("ses", text)


def test_wrong_prefix_and_type() -> None:
    msg = format_id("msg", uuid.uuid4())
    with pytest.raises(InvalidInput, match="expected a ses_"):
        parse_id("ses", msg)
    with pytest.raises(InvalidInput):
        parse_id("ses", 42)
