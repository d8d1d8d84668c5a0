"""Locate cortex's Alembic migrations and run them; grant an application role.

The migrations live in the repository's top-level ``alembic/`` folder and ship
inside the wheel as ``cortex/_alembic``; :func:`script_location` finds
whichever is present, so ``cortex db upgrade`` works from a checkout and from
a plain install alike.

Deployment roles: migrations run as the *owner* role (it creates the tables
and the pg_trgm extension). The service connects as a separate *application*
role that is neither owner nor superuser nor BYPASSRLS, so row-level
security applies to it; :func:`grant_sql` lists what that role needs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import sqlalchemy as sa
from alembic.config import Config
from sqlalchemy.engine import Connection

from alembic import command
from cortex._engine import normalise_url
from cortex.errors import InvalidInput

__all__ = [
    "MIGRATION_LOCK_KEY",
    "alembic_config",
    "downgrade",
    "grant_sql",
    "regrant_sql",
    "script_location",
    "upgrade",
]

# pg_advisory_lock key that serialises concurrent upgrades (a fixed bigint:
# the first 8 bytes of "cortex-migrate" read as an integer).
MIGRATION_LOCK_KEY: Final = int.from_bytes(b"cortex-m", "big") >> 1

_PACKAGE = Path(__file__).resolve().parent
_ROLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def script_location() -> Path:
    """The folder holding env.py and versions/: the wheel's, else the checkout's."""
    # The wheel's copy first: in site-packages, the sibling "alembic" folder is
    # the Alembic library itself, not ours.
    for candidate in (_PACKAGE / "_alembic", _PACKAGE.parent / "alembic"):
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    raise FileNotFoundError("cortex's migrations are missing from this installation")


def alembic_config(url: str | None = None, *, configure_logging: bool = False) -> Config:
    """An Alembic Config for cortex's migrations, bound to ``url`` when given."""
    location = script_location()
    ini = location.parent / "alembic.ini"
    if not ini.is_file():
        ini = location / "alembic.ini"
    config = Config(str(ini) if ini.is_file() else None)
    config.set_main_option("script_location", str(location))
    if url is not None:
        rendered = normalise_url(url).render_as_string(hide_password=False)
        # ConfigParser interpolation: a literal % must be doubled.
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    config.attributes["configure_logging"] = configure_logging
    return config


def upgrade(url: str, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` (advisory-locked; safe to run concurrently)."""
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    """Downgrade the database to ``revision``."""
    command.downgrade(alembic_config(url), revision)


# What an application role needs, object by object: (privileges, object).
_GRANTS: Final = (
    ("USAGE", "SCHEMA public"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE sessions"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE messages"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE pending_inputs"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE session_markers"),
    ("SELECT, INSERT, UPDATE, DELETE", "TABLE scope_data"),
    # connect() reads the schema revision.
    ("SELECT", "TABLE alembic_version"),
    # Tenant-wide search (it checks the bound tenant itself).
    ("EXECUTE", "FUNCTION cortex_search_ids(text)"),
)


def grant_sql(role: str) -> list[str]:
    """The statements that let application role ``role`` use cortex, and no more.

    Raises:
        InvalidInput: if ``role`` is not a plain SQL identifier.
    """
    if _ROLE.fullmatch(role) is None:
        raise InvalidInput(f"role: {role!r} is not a plain SQL identifier")
    return [f'GRANT {privileges} ON {target} TO "{role}"' for privileges, target in _GRANTS]


# Roles that hold cortex's write grants on sessions, other than its owner:
# the application roles `cortex db grant` (or a DBA) set up.
_GRANTED_ROLES_SQL: Final = """
SELECT DISTINCT r.rolname
FROM pg_catalog.pg_class AS c
CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) AS acl
JOIN pg_catalog.pg_roles AS r ON r.oid = acl.grantee
WHERE c.oid = pg_catalog.to_regclass('sessions')
  AND acl.privilege_type = 'INSERT'
  AND acl.grantee <> c.relowner
ORDER BY r.rolname
"""


def regrant_sql(connection: Connection) -> list[str]:
    """The grants that give every existing application role what this schema needs now.

    Deploy pipelines roll back and forward: a downgrade drops objects (the
    search function, the operator tables) and the upgrade recreates them
    without the grants the application role held. The roles that still hold
    cortex's grants on ``sessions`` are taken to be application roles, and
    :func:`grant_sql` is applied to each again, after every upgrade run
    (``alembic/env.py``). Idempotent; nothing to do before ``sessions`` exists.
    """
    roles = connection.execute(sa.text(_GRANTED_ROLES_SQL)).scalars().all()
    if not roles:
        return []
    # After a downgrade some objects do not exist (yet): grant what is there.
    present = [
        (privileges, target)
        for privileges, target in _GRANTS
        if connection.execute(
            sa.text(_EXISTS[target.split()[0]]), {"name": target.split(maxsplit=1)[1]}
        ).scalar()
    ]
    return [
        f'GRANT {privileges} ON {target} TO "{role}"'
        for role in roles
        if _ROLE.fullmatch(role)
        for privileges, target in present
    ]


_EXISTS: Final = {
    "SCHEMA": "SELECT pg_catalog.to_regnamespace(:name) IS NOT NULL",
    "TABLE": "SELECT pg_catalog.to_regclass(:name) IS NOT NULL",
    "FUNCTION": "SELECT pg_catalog.to_regprocedure(:name) IS NOT NULL",
}
