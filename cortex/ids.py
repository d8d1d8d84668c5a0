"""TypeIDs: ``ses_…``, ``msg_…`` and ``era_…`` identifiers over UUIDv7.

The database stores the bare ``uuid``; the prefix is a property of the column,
added on the way out and checked on the way in. UUIDv7 keeps ids k-sortable,
so new rows land at the right edge of every id index.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Final

from typeid import TypeID
from typeid.codecs import base32
from typeid.errors import TypeIDException

from cortex.errors import InvalidInput

__all__ = [
    "ERASURE_PREFIX",
    "MESSAGE_PREFIX",
    "SESSION_PREFIX",
    "format_id",
    "new_uuid",
    "parse_id",
]

SESSION_PREFIX: Final = "ses"
MESSAGE_PREFIX: Final = "msg"
# An erasure's receipt (cortex.models.Erasure).
ERASURE_PREFIX: Final = "era"
# A TypeID suffix is 26 characters; the prefix, "_" and suffix stay short, so
# anything longer is refused before the parser sees it.
_MAX_ID_LENGTH: Final = 64
_MASK_48: Final = (1 << 48) - 1
_MASK_62: Final = (1 << 62) - 1


def new_uuid() -> uuid.UUID:
    """A fresh UUIDv7 as a standard-library ``uuid.UUID``: 48 bits of milliseconds, 74 random.

    Every id gets 74 bits from the operating system's CSPRNG (RFC 9562's
    plain method, no counter): ids are k-sortable by millisecond, and knowing
    one id says nothing about another minted in the same millisecond. A
    counter-based generator (uuid_utils' monotonic uuid7) left neighbours
    only 32 random bits apart, which matters because a caller-chosen id is
    claimable, and a taken one detectable, by any scope of the tenant.
    """
    millis = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big") >> 6  # 74 bits
    value = (
        (millis & _MASK_48) << 80
        | 0x7 << 76  # version 7
        | (rand >> 62) << 64  # rand_a: 12 bits
        | 0b10 << 62  # the RFC 9562 variant
        | (rand & _MASK_62)  # rand_b: 62 bits
    )
    return uuid.UUID(int=value)


def format_id(prefix: str, value: uuid.UUID) -> str:
    """Render a stored uuid as its public TypeID string.

    Straight through the TypeID base32 codec: building a TypeID object per
    row cost more than the rest of a listing row's conversion.
    """
    return f"{prefix}_{base32.encode(value.bytes)}"


def parse_id(prefix: str, text: object, *, field: str = "id") -> uuid.UUID:
    """Parse ``ses_…``/``msg_…`` text to the uuid stored in the database.

    Raises:
        InvalidInput: if ``text`` is not a well-formed TypeID with ``prefix``.
    """
    if not isinstance(text, str) or len(text) > _MAX_ID_LENGTH:
        raise InvalidInput(f"{field}: expected a {prefix}_… id")
    try:
        parsed = TypeID.from_string(text)
    except TypeIDException:
        raise InvalidInput(f"{field}: malformed id {text[:_MAX_ID_LENGTH]!r}") from None
    if parsed.prefix != prefix:
        raise InvalidInput(f"{field}: expected a {prefix}_… id, got {text!r}")
    return uuid.UUID(bytes=parsed.uuid.bytes)
