"""The tests' own URL handling, on both shapes of server URL the suite meets.

``make test`` on a bare machine runs on the embedded server, whose URL names
no host and carries its unix socket's folder as a query
(``postgresql://postgres:@/postgres?host=/…/pgdata``); a machine with a
server on 127.0.0.1 never builds that shape, so it is pinned here.
"""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from cortex._db.engine import normalise_url
from tests.conftest import on_local_port, on_unix_socket, server_address, with_query, with_user

SOCKET = "postgresql://postgres:@/cortex_t_1?host=/tmp/cortex-test-pg-x/pgdata"
# As conftest's with_database renders it: the folder percent-encoded.
SOCKET_RENDERED = "postgresql://postgres:@/cortex_t_1?host=%2Ftmp%2Fcortex-test-pg-x%2Fpgdata"
TCP = "postgresql://postgres@127.0.0.1:5432/cortex_t_1"
URLS = [SOCKET, SOCKET_RENDERED, TCP]


@pytest.mark.parametrize("url", URLS)
def test_with_query_adds_to_the_query_the_url_has(url: str) -> None:
    added = with_query(url, "application_name=cortex-x&options=-c%20statement_timeout%3D5")
    parsed = make_url(added)
    assert parsed.database == "cortex_t_1"
    assert parsed.query["application_name"] == "cortex-x"
    assert parsed.query["options"] == "-c statement_timeout=5"
    assert parsed.query.get("host") == make_url(url).query.get("host")
    normalise_url(added)  # every parameter one cortex takes, none mangled into another


@pytest.mark.parametrize("url", URLS)
def test_with_user_keeps_the_database_and_the_socket(url: str) -> None:
    parsed = make_url(with_user(url, "cortex_app_1"))
    assert (parsed.username, parsed.database) == ("cortex_app_1", "cortex_t_1")
    assert parsed.query.get("host") == make_url(url).query.get("host")


def test_server_address_reads_the_socket_folder_as_libpq_does() -> None:
    assert server_address(SOCKET) == ("/tmp/cortex-test-pg-x/pgdata", 5432)
    assert server_address(SOCKET_RENDERED) == ("/tmp/cortex-test-pg-x/pgdata", 5432)
    assert server_address(SOCKET + "&port=6000") == ("/tmp/cortex-test-pg-x/pgdata", 6000)
    assert server_address(TCP) == ("127.0.0.1", 5432)
    assert on_unix_socket(SOCKET)
    assert on_unix_socket(SOCKET_RENDERED)
    assert not on_unix_socket(TCP)


@pytest.mark.parametrize("url", URLS)
def test_on_local_port_drops_the_socket_that_would_win(url: str) -> None:
    through = with_query(url, "application_name=cortex-x")
    moved = make_url(on_local_port(through, 6432))
    assert (moved.host, moved.port, moved.database) == ("127.0.0.1", 6432, "cortex_t_1")
    assert dict(moved.query) == {"application_name": "cortex-x"}
    assert server_address(on_local_port(through, 6432)) == ("127.0.0.1", 6432)
