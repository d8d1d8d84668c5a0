"""Revision 20261203000018: the title search index holds titled sessions only.

Upgrade and downgrade both ways: the index's form, the two search functions'
text (restored exactly), the same matches before and after, and a run killed
after either online step finishing on the next one.
"""

from __future__ import annotations

import pytest

from cortex.errors import SchemaMismatch
from cortex.migrate import downgrade as downgrade_to
from cortex.migrate import upgrade
from tests.migrations.legacy import execute, fetch

REVISION = "20261203000018"
BEFORE = "20261202000017"
NAME = "ix_sessions_tenant_title_trgm"

_INDEXES = """
SELECT c.relname::text AS name, pg_get_indexdef(c.oid) AS definition, i.indisvalid AS valid
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = 'sessions'::regclass AND c.relname LIKE 'ix_sessions_tenant_title_trgm%'
"""
_FUNCTIONS = """
SELECT p.proname::text AS name, pg_get_functiondef(p.oid) AS definition FROM pg_proc AS p
WHERE p.proname IN ('cortex_search_ids', 'cortex_tenant_search') ORDER BY 1
"""
_SESSIONS = """
INSERT INTO sessions (tenant_id, id, agent_id, scope, scope_depth, title, last_message) VALUES
  ('acme', '00000000-0000-0000-0000-00000000000a', 'bot', 'acme', 1, 'Alpha plans', ''),
  ('acme', '00000000-0000-0000-0000-00000000000b', 'bot', 'acme', 1, '', 'beta notes'),
  ('acme', '00000000-0000-0000-0000-00000000000c', 'bot', 'acme', 1, 'Gamma', 'alpha too'),
  ('acme', '00000000-0000-0000-0000-00000000000d', 'bot', 'acme', 1, '', ''),
  ('else', '00000000-0000-0000-0000-00000000000e', 'bot', 'else', 1, 'Alpha', 'beta')
"""
_PATTERNS = ("%alpha%", "%BETA%", "%gamma%", "%a%", "%nothing%", "%/%%")


def _indexes(url: str) -> dict[str, str]:
    rows = fetch(url, _INDEXES)
    assert all(r["valid"] for r in rows)
    return {r["name"]: r["definition"] for r in rows}


def _functions(url: str) -> dict[str, str]:
    return {r["name"]: r["definition"] for r in fetch(url, _FUNCTIONS)}


def _matches(url: str) -> dict[str, tuple[list[str], list[str]]]:
    """Per pattern: what each function finds for tenant acme (as the owner, a superuser)."""
    out = {}
    for pattern in _PATTERNS:
        ids = fetch(
            url,
            "SELECT set_config('cortex.tenant', 'acme', false),"
            " (SELECT array_agg(i::text ORDER BY i) FROM cortex_search_ids($1) AS i) AS a,"
            " (SELECT array_agg(i::text ORDER BY i) FROM unnest(cortex_tenant_search('acme', $1))"
            "  AS i) AS b",
            pattern,
        )[0]
        out[pattern] = (ids["a"] or [], ids["b"] or [])
    return out


def test_upgrade_and_downgrade_change_the_index_and_the_functions_alone(blank_db: str) -> None:
    upgrade(blank_db, BEFORE)
    execute(blank_db, _SESSIONS)
    full, functions, matches = _indexes(blank_db), _functions(blank_db), _matches(blank_db)
    assert "WHERE" not in full[NAME]
    assert matches["%alpha%"][0] == [
        "00000000-0000-0000-0000-00000000000a",
        "00000000-0000-0000-0000-00000000000c",
    ]
    upgrade(blank_db, REVISION)
    assert _indexes(blank_db) == {NAME: full[NAME] + " WHERE (title <> ''::text)"}
    after = _functions(blank_db)
    for name, definition in after.items():
        assert "(s.title <> '' AND s.title ILIKE pattern ESCAPE '/')" in definition, name
    assert _matches(blank_db) == matches  # an empty title never held a term
    downgrade_to(blank_db, BEFORE)
    assert _indexes(blank_db) == full
    assert _functions(blank_db) == functions  # the earlier text, exactly
    upgrade(blank_db, REVISION)
    assert _functions(blank_db) == after


@pytest.mark.parametrize("killed_after", ["the build", "the drop"])
def test_a_killed_upgrade_finishes_on_the_next_run(blank_db: str, killed_after: str) -> None:
    upgrade(blank_db, BEFORE)
    # What a run killed mid-way leaves: the partial index built beside the
    # old one, and perhaps the old one dropped (the rename not yet done).
    execute(
        blank_db,
        f"CREATE INDEX {NAME}_next ON sessions USING gin (tenant_id, title gin_trgm_ops)"
        " WHERE title <> ''",
    )
    if killed_after == "the drop":
        execute(blank_db, f"DROP INDEX {NAME}")
    upgrade(blank_db, REVISION)
    assert list(_indexes(blank_db)) == [NAME]
    assert _indexes(blank_db)[NAME].endswith("WHERE (title <> ''::text)")


def test_a_killed_concurrent_build_is_built_again(blank_db: str) -> None:
    upgrade(blank_db, BEFORE)
    # A CREATE INDEX CONCURRENTLY killed part way leaves the index invalid.
    execute(
        blank_db,
        f"CREATE INDEX {NAME}_next ON sessions USING gin (tenant_id, title gin_trgm_ops)",
        f"UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{NAME}_next'::regclass",
    )
    upgrade(blank_db, REVISION)
    assert list(_indexes(blank_db)) == [NAME]  # all valid (checked by _indexes)
    assert _indexes(blank_db)[NAME].endswith("WHERE (title <> ''::text)")


def test_an_index_of_another_table_under_the_building_name_is_refused(blank_db: str) -> None:
    """Any role that may create in the schema can take the name; cortex keeps and drops only its own."""
    upgrade(blank_db, BEFORE)
    execute(
        blank_db,
        "CREATE TABLE decoy (title text)",
        f"CREATE INDEX {NAME}_next ON decoy (title) WHERE title <> ''",
    )
    with pytest.raises(SchemaMismatch, match="exists on another table than sessions"):
        upgrade(blank_db, REVISION)
    assert "WHERE" not in _indexes(blank_db)[NAME]  # the title index is still there, untouched
    execute(blank_db, "DROP TABLE decoy")
    upgrade(blank_db, REVISION)
    assert _indexes(blank_db)[NAME].endswith("WHERE (title <> ''::text)")
