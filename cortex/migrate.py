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

from alembic.config import Config

from alembic import command
from cortex._engine import normalise_url
from cortex.errors import InvalidInput

__all__ = [
    "MIGRATION_LOCK_KEY",
    "alembic_config",
    "downgrade",
    "grant_sql",
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


def grant_sql(role: str) -> list[str]:
    """The statements that let application role ``role`` use cortex, and no more.

    Raises:
        InvalidInput: if ``role`` is not a plain SQL identifier.
    """
    if _ROLE.fullmatch(role) is None:
        raise InvalidInput(f"role: {role!r} is not a plain SQL identifier")
    return [
        f'GRANT USAGE ON SCHEMA public TO "{role}"',
        f"GRANT SELECT, INSERT, UPDATE, DELETE ON sessions, messages, pending_inputs, "
        f'session_markers TO "{role}"',
        # connect() reads the schema revision.
        f'GRANT SELECT ON alembic_version TO "{role}"',
        # Tenant-wide search (it checks the bound tenant itself).
        f'GRANT EXECUTE ON FUNCTION cortex_search_ids(text) TO "{role}"',
    ]
