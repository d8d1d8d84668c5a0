from __future__ import annotations

import itertools
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
    millis = [v.int >> 80 for v in values]
    assert sorted(millis) == millis  # k-sortable by millisecond
    assert all(v.variant == uuid.RFC_4122 for v in values)


def test_ids_minted_together_share_no_counter() -> None:
    # Neighbours minted in one millisecond must be as far apart as any two
    # random 62-bit strings (about 31 differing bits), not a counter step.
    values = [new_uuid() for _ in range(2_000)]
    pairs = [(a, b) for a, b in itertools.pairwise(values) if a.int >> 80 == b.int >> 80]
    assert pairs, "expected ids minted within one millisecond"
    low = (1 << 62) - 1
    differing = [bin((a.int ^ b.int) & low).count("1") for a, b in pairs]
    assert sum(differing) / len(differing) > 24


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
