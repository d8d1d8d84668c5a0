"""Database URLs: libpq query parameters are translated once, the rest refused by name."""

from __future__ import annotations

import anyio
import pytest

import cortex
from cortex._db.engine import connect_options, driver_dsn, normalise_url


def test_port_out_of_range_is_invalid_input() -> None:
    with pytest.raises(cortex.InvalidInput, match="port"):
        normalise_url("postgresql://u@127.0.0.1:99999/x")


def test_connect_with_port_out_of_range_is_invalid_input() -> None:
    async def open_store() -> None:
        async with cortex.connect("postgresql://u@127.0.0.1:99999/x"):
            pass

    with pytest.raises(cortex.InvalidInput, match="port"):
        anyio.run(open_store)


@pytest.mark.parametrize(
    "query",
    [
        "sslmode=require",
        "sslmode=verify-full&sslrootcert=/ca.pem&sslcert=/c.pem&sslkey=/c.key",
        "application_name=billing&connect_timeout=5",
        "options=-c%20statement_timeout%3D5000",
        "target_session_attrs=read-write",
        "host=/tmp/socket-dir",
    ],
)
def test_libpq_parameters_are_accepted(query: str) -> None:
    assert normalise_url(f"postgresql://u@h/db?{query}").drivername == "postgresql+asyncpg"


@pytest.mark.parametrize(
    ("query", "named"),
    [
        ("sslmode=sometimes", "sslmode"),
        ("gssencmode=disable", "gssencmode"),
        ("keepalives=1", "keepalives"),
        ("connect_timeout=soon", "connect_timeout"),
        ("connect_timeout=-1", "connect_timeout"),
        ("target_session_attrs=whatever", "target_session_attrs"),
        ("sslmode=require&sslmode=disable", "sslmode"),
    ],
)
def test_other_parameters_are_refused_by_name(query: str, named: str) -> None:
    with pytest.raises(cortex.InvalidInput, match=named):
        normalise_url(f"postgresql://u@h/db?{query}")


def test_connect_options_translate_once() -> None:
    url, args = connect_options(
        "postgresql://u:pw@h:6543/db?sslmode=verify-full&sslrootcert=/ca.pem"
        "&application_name=billing&connect_timeout=7&options=-c%20x%3D1"
    )
    # SQLAlchemy sees no libpq parameter (it would pass each to asyncpg.connect as a keyword).
    assert dict(url.query) == {}
    assert (url.host, url.port, url.database, url.username) == ("h", 6543, "db", "u")
    assert args["timeout"] == 7.0
    # The rest goes to asyncpg's own libpq-compatible parser, once.
    assert args["dsn"].startswith("postgresql://?")
    for part in ("sslmode=verify-full", "sslrootcert=%2Fca.pem", "application_name=billing"):
        assert part in args["dsn"]
    assert "connect_timeout" not in args["dsn"]


def test_connect_options_keep_the_socket_host() -> None:
    url, args = connect_options("postgresql://u@/db?host=/run/pg")
    assert dict(url.query) == {"host": "/run/pg"}
    assert "dsn" not in args


def test_driver_dsn_drops_the_client_side_timeout() -> None:
    dsn = driver_dsn("postgresql://u@h/db?sslmode=require&connect_timeout=3")
    assert "sslmode=require" in dsn
    assert "connect_timeout" not in dsn
