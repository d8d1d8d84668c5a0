"""The routine keys of the hot statements are pinned: a change to their compiled SQL is deliberate.

A routine is found by the digest of the SQL it runs (cortex._db.routines), so
SQL that compiles differently leaves every installed routine unused until the
next ``cortex db upgrade``: only a change meant to do that may update these.
"""

from __future__ import annotations

import hashlib

import pytest
import sqlalchemy as sa

from cortex._db.executor import compile_composite, compile_statement
from cortex._db.routines import installed_statements, wanted_count
from cortex._sql.hot import hot_composites

# {distributed: the (how many routines, SHA-256 of their sorted keys joined by
# spaces) pairs the SQLAlchemy releases pyproject allows compile them to}:
# 2.1 and 2.0.58 give the first; earlier 2.0 releases cast a SMALLINT bind as
# INTEGER and give the second.
_PINNED = {
    False: {
        (118, "73a159793f036cde262697917f84b9e5be0b2db3f62a15d90e820d3b56cc3fd1"),
        (118, "4d49018abb5405433eb1bd9f6ecf31cf1f2fd2ff2cf428b92492fe138b6826ea"),
    },
    True: {
        (102, "2add9b9491ce1748194d9af05867a458d000ecb7be9bedfd6012f4e9e64fa73c"),
        (102, "7e3196dd35b11d40839f5cb749f32c4c2a6ac916f0450518818685bc99166a97"),
    },
}


def _keys(distributed: bool) -> list[str]:
    statements = [compile_statement(stmt).key for stmt in installed_statements(distributed)]
    composites = [compile_composite(c).key for c in hot_composites(distributed)]
    return sorted(statements + composites)


@pytest.mark.parametrize("distributed", [False, True])
def test_the_hot_statements_compile_to_the_pinned_sql(distributed: bool) -> None:
    keys = _keys(distributed)
    digest = hashlib.sha256(" ".join(keys).encode()).hexdigest()
    assert (len(keys), digest) in _PINNED[distributed], (sa.__version__, digest, keys)
    assert wanted_count(distributed) == len(keys)
