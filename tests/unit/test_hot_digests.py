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
        (118, "0c7dcbf6b89e86f324f3cd16a28424d494b33269867719175adc284efb215a02"),
        (118, "36369b2ea4a5fff22a30f31da7b46a672321e75c38231f2a9fc73a8d45adf1f8"),
    },
    True: {
        (102, "59eac13c438fc86aa1be4adb06e390ea5e6b37f5105bac91687f5e7c5de9d071"),
        (102, "85d2794c6b36ddce033d2abd9b8f361b324a658006ebf93e1891a2d395c0c9ec"),
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
