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
        (118, "ae72ddf0d4030e43e194979f52b25673d9d6dd584401d63d3b0302acc530195c"),
        (118, "8eecc7582c99acedb340ef2df72e1f05422e9fb2cd29782946389c84d880af7a"),
    },
    True: {
        (102, "f054c3a9866e062b498b3c791fee91bb6a5236ef5b5b1796f750194e3651a58d"),
        (102, "13b5d6fd66b4f72ede26797ff57d9e661919cfa84f30a5c026709d29c9c0a792"),
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
