"""A role that may only create in the schema plants what a revision makes: the upgrade refuses it.

PostgreSQL 14 and older grant CREATE on ``public`` to every role, and a
deployment may grant it: such a role can take any free name there before a
revision runs. Each test plants one kind of object a revision creates, as a
role holding only CREATE on ``public``, and checks that ``cortex db upgrade``
raises :class:`SchemaMismatch` naming the object and its owner, leaves the
database at the revision before, and adopted nothing. Most run twice: with
the check every run starts with (``ddl_v1.preflight_check``) and without
it, so the revision's own checks are proved too.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from alembic.script import ScriptDirectory

from cortex._revision_helpers import citus_v1, ddl_v1
from cortex.cli import main
from cortex.errors import SchemaMismatch
from cortex.migrate import alembic_config, upgrade
from tests.conftest import with_database
from tests.migrations.legacy import current, execute, fetch, plain_owner_database


@dataclass(frozen=True)
class Planted:
    owner: str  # the migrating role's URL
    planter: str  # a role with CREATE on public and nothing else
    role: str


@contextmanager
def _add_planter(server_url: str, owner_url: str, as_super: str) -> Iterator[Planted]:
    role = f"planter_{uuid.uuid4().hex[:8]}"
    execute(server_url, f'CREATE ROLE "{role}" LOGIN')
    try:
        execute(as_super, f'GRANT CREATE ON SCHEMA public TO "{role}"')
        database = fetch(as_super, "SELECT current_database() AS d")[0]["d"]
        yield Planted(owner_url, with_database(server_url, database, user=role), role)
    finally:
        execute(as_super, f'DROP OWNED BY "{role}" CASCADE')
        execute(server_url, f'DROP ROLE "{role}"')


@pytest.fixture
def planted(server_url: str, blank_db: str) -> Iterator[Planted]:
    """A blank database migrated by the superuser, and a planter role in it."""
    with _add_planter(server_url, blank_db, blank_db) as planted:
        yield planted


@pytest.fixture(params=["preflight", "revision"])
def layer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which check must refuse: the run's first one, or (without it) the revision's own."""
    if request.param == "revision":
        monkeypatch.setattr(ddl_v1, "preflight_check", lambda: "SELECT 1")
    return str(request.param)


def _refused(url: str, revision: str, *named: str) -> str:
    with pytest.raises(SchemaMismatch) as caught:
        upgrade(url, revision)
    message = str(caught.value)
    for word in named:
        assert word in message, message
    return message


def _previous(revision: str) -> str:
    script = ScriptDirectory.from_config(alembic_config())
    found = script.get_revision(revision)
    assert found is not None
    assert isinstance(found.down_revision, str)
    return found.down_revision


def _owner_of(url: str, relation: str) -> str | None:
    rows = fetch(
        url,
        "SELECT pg_get_userbyid(relowner) AS o FROM pg_class"
        " WHERE relname = $1 AND relnamespace = 'public'::regnamespace",
        relation,
    )
    return rows[0]["o"] if rows else None


def _has_column(url: str, table: str, column: str) -> bool:
    return bool(
        fetch(
            url,
            "SELECT FROM information_schema.columns WHERE table_name = $1 AND column_name = $2",
            table,
            column,
        )
    )


SCOPE_DATA = (
    "CREATE TABLE scope_data ("
    ' tenant_id text COLLATE "C" NOT NULL, scope text COLLATE "C" NOT NULL,'
    " data jsonb NOT NULL DEFAULT '{}'::jsonb, updated_at timestamptz NOT NULL DEFAULT now(),"
    " CONSTRAINT pk_scope_data PRIMARY KEY (tenant_id, scope))"
)
MATCH = "tenant_id = current_setting('cortex.tenant', true)"


def test_a_planted_scope_data_with_a_permissive_policy_is_refused(
    planted: Planted, layer: str
) -> None:
    before = "20261201000010"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        SCOPE_DATA,
        "ALTER TABLE scope_data ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY tenant_isolation ON scope_data USING (true) WITH CHECK (true)",
    )
    _refused(planted.owner, "head", "scope_data", planted.role)
    assert current(planted.owner) == [before]
    assert _owner_of(planted.owner, "scope_data") == planted.role
    assert not _has_column(planted.owner, "sessions", "session_key")
    assert not fetch(
        planted.owner,
        "SELECT FROM pg_policy WHERE polrelid = 'scope_data'::regclass"
        " AND polname <> 'tenant_isolation'",
    )


def test_the_cli_refuses_a_planted_scope_data_and_names_its_owner(
    planted: Planted, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--database-url", planted.owner, "db", "upgrade", "20261201000010"]) == 0
    execute(planted.planter, SCOPE_DATA)
    capsys.readouterr()
    assert main(["--database-url", planted.owner, "db", "upgrade"]) != 0
    err = capsys.readouterr().err
    assert "scope_data" in err, err
    assert planted.role in err, err
    assert current(planted.owner) == ["20261201000010"]


def test_a_plain_owner_refuses_a_planted_scope_data(server_url: str) -> None:
    with plain_owner_database(server_url) as (as_owner, as_super):
        upgrade(as_owner, "20261201000010")
        with _add_planter(server_url, as_owner, as_super) as planted:
            execute(planted.planter, SCOPE_DATA)
            _refused(as_owner, "head", "scope_data", planted.role)
            assert current(as_owner) == ["20261201000010"]


def test_a_policy_of_cortex_s_name_but_another_definition_is_refused(blank_db: str) -> None:
    """Made by the migrating role itself, so only its definition tells it from cortex's."""
    upgrade(blank_db, "20261201000010")
    execute(
        blank_db,
        SCOPE_DATA.replace(
            "(tenant_id, scope))",
            "(tenant_id, scope), CONSTRAINT ck_scope_data_scope_tenant"
            " CHECK (tenant_id = split_part(scope, '/', 1)), CONSTRAINT ck_scope_data_data_size"
            " CHECK (octet_length(data::text) <= 1048576))",
        ),
        "ALTER TABLE scope_data ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY tenant_isolation ON scope_data USING (true) WITH CHECK (true)",
    )
    _refused(blank_db, "head", "tenant_isolation", "scope_data")
    assert current(blank_db) == ["20261201000010"]


def test_an_extra_permissive_policy_on_a_cortex_table_is_refused(blank_db: str) -> None:
    upgrade(blank_db, "20260824000004")
    execute(blank_db, "CREATE POLICY open_door ON messages USING (true) WITH CHECK (true)")
    _refused(blank_db, "head", "open_door", "messages")
    assert current(blank_db) == ["20260824000004"]


def test_a_planted_cortex_bounded_data_is_refused(planted: Planted, layer: str) -> None:
    before = "20261201000016"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE FUNCTION cortex_bounded_data(doc jsonb) RETURNS jsonb LANGUAGE sql"
        " AS $$ SELECT doc /* planted */ $$",
    )
    _refused(planted.owner, "head", "cortex_bounded_data", planted.role)
    assert current(planted.owner) == [before]
    row = fetch(
        planted.owner,
        "SELECT pg_get_userbyid(proowner) AS owner, prosrc FROM pg_proc"
        " WHERE proname = 'cortex_bounded_data'",
    )
    assert [(r["owner"], "planted" in r["prosrc"]) for r in row] == [(planted.role, True)]


def test_a_better_matching_overload_of_a_cortex_function_is_refused(
    planted: Planted, layer: str
) -> None:
    before = "20261201000016"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE FUNCTION cortex_bounded_data(doc json) RETURNS jsonb LANGUAGE sql"
        " AS $$ SELECT doc::jsonb $$",
    )
    _refused(planted.owner, "head", "cortex_bounded_data(json)", planted.role)
    assert current(planted.owner) == [before]
    assert not fetch(
        planted.owner,
        "SELECT FROM pg_proc WHERE proname = 'cortex_bounded_data'"
        " AND proargtypes[0] = 'jsonb'::regtype",
    )


def test_a_planted_search_function_is_refused(planted: Planted, layer: str) -> None:
    before = "20261001000006"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE FUNCTION cortex_search_ids(pattern text) RETURNS SETOF uuid"
        " LANGUAGE sql SECURITY DEFINER AS $$ SELECT NULL::uuid $$",
    )
    _refused(planted.owner, "head", "cortex_search_ids", planted.role)
    assert current(planted.owner) == [before]
    # Nothing of revision 20261015000007 was built.
    assert _owner_of(planted.owner, "ix_sessions_tenant_title_trgm") is None


def test_a_planted_trigger_function_is_refused(planted: Planted, layer: str) -> None:
    before = "20261201000008"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE FUNCTION cortex_forget_metadata_text() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN RETURN NEW; END $$",
    )
    _refused(planted.owner, "head", "cortex_forget_metadata_text", planted.role)
    assert current(planted.owner) == [before]
    assert not _has_column(planted.owner, "sessions", "metadata_json")


def test_a_planted_schema_compat_table_is_refused(planted: Planted, layer: str) -> None:
    before = "20261201000009"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE TABLE cortex_schema_compat (singleton boolean DEFAULT true PRIMARY KEY,"
        " oldest_code_revision text NOT NULL)",
    )
    _refused(planted.owner, "head", "cortex_schema_compat", planted.role)
    assert current(planted.owner) == [before]
    assert not fetch(planted.owner, "SELECT FROM cortex_schema_compat")
    assert _owner_of(planted.owner, "cortex_schema_compat") == planted.role


def test_a_planted_index_name_is_refused(planted: Planted, layer: str) -> None:
    before = "20261201000010"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE TABLE decoy (x int)",
        "CREATE INDEX uq_sessions_key ON decoy (x)",
    )
    _refused(planted.owner, "head", "uq_sessions_key", planted.role)
    assert current(planted.owner) == [before]
    assert _owner_of(planted.owner, "scope_data") is None


def test_a_planted_relation_in_an_index_s_name_is_refused(planted: Planted) -> None:
    upgrade(planted.owner, "20260824000002")
    execute(planted.planter, "CREATE VIEW uq_sessions_default AS SELECT 1 AS x")
    _refused(planted.owner, "head", "uq_sessions_default", planted.role)
    assert current(planted.owner) == ["20260824000002"]


def test_a_planted_sessions_table_is_refused(planted: Planted, layer: str) -> None:
    upgrade(planted.owner, "20260801000001")
    execute(planted.planter, "CREATE TABLE sessions (tenant_id text, id uuid)")
    _refused(planted.owner, "head", "sessions", planted.role)
    assert current(planted.owner) == ["20260801000001"]
    assert not _has_column(planted.owner, "messages", "tenant_id")


def test_a_planted_alembic_version_is_refused(planted: Planted) -> None:
    execute(planted.planter, "CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
    _refused(planted.owner, "head", "alembic_version", planted.role)
    assert _owner_of(planted.owner, "messages") is None
    assert not fetch(planted.owner, "SELECT FROM alembic_version")


def test_a_planted_shadow_of_a_catalog_function_is_refused(planted: Planted) -> None:
    """``pg_column_size(jsonb)`` is a better match than ``pg_catalog.pg_column_size("any")``."""
    before = "20261201000016"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE FUNCTION pg_column_size(doc jsonb) RETURNS integer LANGUAGE sql AS $$ SELECT 0 $$",
    )
    _refused(planted.owner, "head", "pg_column_size(jsonb)", planted.role)
    assert current(planted.owner) == [before]


def _grant_create_on_database(planted: Planted) -> tuple[str, str]:
    """The planter may create schemas; the migrating login's name and the database's."""
    (me,) = fetch(planted.owner, "SELECT current_user::text AS u, current_database()::text AS d")
    execute(planted.owner, f'GRANT CREATE ON DATABASE "{me["d"]}" TO "{planted.role}"')
    return me["u"], me["d"]


def test_a_schema_named_like_the_migrating_login_is_refused(planted: Planted) -> None:
    """First on the default path ("$user", public): cortex would create its tables there."""
    login, _ = _grant_create_on_database(planted)
    execute(planted.planter, f'CREATE SCHEMA "{login}"')
    _refused(planted.owner, "head", f"{login}", planted.role, "public")
    assert _owner_of(planted.owner, "sessions") is None


def test_a_shadow_planted_later_on_the_path_is_refused(planted: Planted) -> None:
    """Any schema on the path takes an unqualified call that its overload matches better."""
    before = "20261201000012"
    upgrade(planted.owner, before)
    _, database = _grant_create_on_database(planted)
    execute(
        planted.planter,
        "CREATE SCHEMA extra",
        "CREATE FUNCTION extra.unnest(v int2vector) RETURNS SETOF smallint"
        " LANGUAGE sql AS $$ SELECT 1::smallint $$",
    )
    execute(planted.owner, f'ALTER DATABASE "{database}" SET search_path = public, extra')
    _refused(planted.owner, "head", "unnest(int2vector)", planted.role)
    assert current(planted.owner) == [before]


def test_the_catch_up_backfill_refuses_a_planted_shadow(
    planted: Planted, capsys: pytest.CaptureFixture[str]
) -> None:
    upgrade(planted.owner)
    execute(
        planted.planter,
        "CREATE FUNCTION split_part(a text, b text, n bigint) RETURNS text"
        " LANGUAGE sql AS $$ SELECT a $$",
    )
    capsys.readouterr()
    assert main(["--database-url", planted.owner, "db", "backfill"]) != 0
    err = capsys.readouterr().err
    assert "split_part(text,text,bigint)" in err, err
    assert planted.role in err, err


def test_a_planted_routine_name_is_refused(planted: Planted) -> None:
    upgrade(planted.owner)
    execute(
        planted.planter,
        "CREATE FUNCTION cortex_r_planted(tenant text) RETURNS int LANGUAGE sql AS $$ SELECT 1 $$",
    )
    _refused(planted.owner, "head", "cortex_r_planted", planted.role)


def test_a_planted_type_in_a_table_s_name_is_refused(planted: Planted, layer: str) -> None:
    before = "20261201000010"
    upgrade(planted.owner, before)
    execute(planted.planter, "CREATE TYPE scope_data AS (tenant_id text)")
    _refused(planted.owner, "head", "type scope_data", planted.role)
    assert current(planted.owner) == [before]


def test_a_digest_column_of_another_type_is_refused(blank_db: str) -> None:
    before = "20261203000018"
    upgrade(blank_db, before)
    execute(blank_db, "ALTER TABLE messages ADD COLUMN deltas_digest text")
    _refused(blank_db, "head", "messages.deltas_digest", "text")
    assert current(blank_db) == [before]


def test_a_lineage_column_of_another_type_is_refused(blank_db: str) -> None:
    before = "20261205000020"
    upgrade(blank_db, before)
    execute(blank_db, "ALTER TABLE sessions ADD COLUMN forked_from_seq bigint")
    _refused(blank_db, "head", "sessions.forked_from_seq", "bigint")
    assert current(blank_db) == [before]
    assert not _has_column(blank_db, "sessions", "forked_from_id")


def test_an_extension_another_role_created_is_refused(planted: Planted) -> None:
    """pg_trgm is trusted: a role with CREATE on the database may create it, and owns it then."""
    database = fetch(planted.owner, "SELECT current_database() AS d")[0]["d"]
    execute(planted.owner, f'GRANT CREATE ON DATABASE "{database}" TO "{planted.role}"')
    execute(planted.planter, "CREATE EXTENSION pg_trgm")
    _refused(planted.owner, "head", "extension pg_trgm", planted.role)
    assert _owner_of(planted.owner, "sessions") is None
    execute(planted.owner, f'REVOKE CREATE ON DATABASE "{database}" FROM "{planted.role}"')


def test_extensions_a_superuser_created_are_cortex_s(server_url: str) -> None:
    """A DBA may create the extensions before a plain owner migrates: a superuser is trusted."""
    with plain_owner_database(server_url) as (as_owner, as_super):
        execute(as_super, "CREATE EXTENSION pg_trgm", "CREATE EXTENSION btree_gin")
        upgrade(as_owner)
        assert current(as_owner) == [_head()]


def test_the_offline_script_refuses_a_planted_table_too(planted: Planted) -> None:
    """``cortex db sql`` run by psql: the checks are in the script and stop it."""
    before = "20261201000010"
    upgrade(planted.owner, before)
    execute(planted.planter, SCOPE_DATA)
    command = [sys.executable, "-m", "cortex", "--database-url", planted.owner, "db", "sql"]
    script = subprocess.run(
        [*command, f"{before}:head"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    run = subprocess.run(
        ["psql", "-v", "ON_ERROR_STOP=1", "-q", planted.owner],
        input=script,
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0
    assert "scope_data" in run.stderr, run.stderr
    assert planted.role in run.stderr, run.stderr
    assert current(planted.owner) == [before]
    assert not _has_column(planted.owner, "sessions", "session_key")


def _head() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


# --- what cortex made itself passes -------------------------------------------------


def test_every_revision_runs_again_over_what_it_made(blank_db: str) -> None:
    """Killed after its last step, before Alembic recorded it: each revision runs again."""
    script = ScriptDirectory.from_config(alembic_config())
    chain = [rev.revision for rev in reversed(list(script.walk_revisions()))]
    upgrade(blank_db, chain[0])
    for revision in chain[1:]:
        upgrade(blank_db, revision)
        execute(blank_db, f"UPDATE alembic_version SET version_num = '{_previous(revision)}'")
        upgrade(blank_db, revision)
        assert current(blank_db) == [revision]


def test_a_revision_killed_half_way_runs_again(
    blank_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after ``scope_data`` exists, before its policy: the rerun makes the policy."""
    upgrade(blank_db, "20261201000010")

    class Killed(Exception):
        pass

    def killed(table: str) -> None:
        raise Killed(table)

    monkeypatch.setattr(citus_v1, "distribute", killed)
    with pytest.raises(Killed):
        upgrade(blank_db, "20261201000011")
    monkeypatch.undo()
    assert current(blank_db) == ["20261201000010"]
    assert _owner_of(blank_db, "scope_data") is not None
    upgrade(blank_db)
    policies = fetch(
        blank_db, "SELECT polname FROM pg_policy WHERE polrelid = 'scope_data'::regclass"
    )
    assert [r["polname"] for r in policies] == ["tenant_isolation"]


ERASURES = (
    "CREATE TABLE erasures ("
    ' tenant_id text COLLATE "C" NOT NULL, id uuid NOT NULL, scope text COLLATE "C" NOT NULL,'
    " state text NOT NULL DEFAULT 'running', at timestamptz NOT NULL DEFAULT now(),"
    " finished_at timestamptz, sessions bigint NOT NULL DEFAULT 0,"
    " messages bigint NOT NULL DEFAULT 0, pending_inputs bigint NOT NULL DEFAULT 0,"
    " markers bigint NOT NULL DEFAULT 0, scope_documents bigint NOT NULL DEFAULT 0,"
    " CONSTRAINT pk_erasures PRIMARY KEY (tenant_id, id))"
)


def test_a_planted_erasures_table_is_refused(planted: Planted, layer: str) -> None:
    before = "20261205000021"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        ERASURES,
        "ALTER TABLE erasures ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY tenant_isolation ON erasures USING (true) WITH CHECK (true)",
    )
    _refused(planted.owner, "head", "erasures", planted.role)
    assert current(planted.owner) == [before]
    assert _owner_of(planted.owner, "erasures") == planted.role
    assert _owner_of(planted.owner, "retention_policies") is None


def test_a_planted_type_in_retention_policies_name_is_refused(planted: Planted) -> None:
    before = "20261205000021"
    upgrade(planted.owner, before)
    execute(planted.planter, "CREATE TYPE retention_policies AS (tenant_id text)")
    _refused(planted.owner, "head", "type retention_policies", planted.role)
    assert current(planted.owner) == [before]
    assert _owner_of(planted.owner, "erasures") is None


def test_a_planted_running_index_name_is_refused(planted: Planted) -> None:
    before = "20261205000021"
    upgrade(planted.owner, before)
    execute(
        planted.planter,
        "CREATE TABLE decoy (x int)",
        "CREATE INDEX uq_erasures_running ON decoy (x)",
    )
    _refused(planted.owner, "head", "uq_erasures_running", planted.role)
    assert current(planted.owner) == [before]
    assert _owner_of(planted.owner, "erasures") is None


def test_an_open_policy_on_a_cortex_made_erasures_is_refused(blank_db: str) -> None:
    """Made by the migrating role itself, so only the policy's definition tells it apart."""
    before = "20261205000021"
    upgrade(blank_db, before)
    execute(
        blank_db,
        ERASURES,
        "ALTER TABLE erasures ENABLE ROW LEVEL SECURITY",
        "CREATE POLICY tenant_isolation ON erasures USING (true) WITH CHECK (true)",
    )
    _refused(blank_db, "head", "tenant_isolation", "erasures")
    assert current(blank_db) == [before]
