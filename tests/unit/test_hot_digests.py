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
        (118, "e55de35724bdbbf21249571d2f7654a8737297cca5f36bbebc37ff5885bd93a5"),
        (118, "39dc5285abd5e066519a7d6acfbc000c49e95662dbaaeb4063b75d754d22a083"),
    },
    True: {
        (102, "05868d93f223c87e0dc7ed9c2e809e9fa89c41d841a9929c12c4d9b552a0cd12"),
        (102, "def64ce5cf9260206b7a7b9a511bf20762aa94911e65a63b295087c989fc4e39"),
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
