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
        (118, "fd0bc5160433b878b159e55c51e18167edbf40db12db522dc4e9452886e65738"),
        (118, "f731e5ed7483caf5bce25fa5d6112b5b6159f66f0ad30060d2fd7934d8138456"),
    },
    True: {
        (102, "7e7a6b1a3b2cf38fd2b66bb19eaedd89d014766ba6d5fb50d668d52238c72185"),
        (102, "bac0d7df211c06f6c6b3f5dbb728c83c8473962bccc13f59232ad7cab8acea76"),
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
