"""libpq URL parameters against real servers: the test server, and one of our own with TLS.

The TLS server is started here (initdb + pg_ctl of the machine's PostgreSQL)
with a certificate authority made by openssl for the test: the server's
certificate names 127.0.0.1, and ``pg_hba.conf`` admits only TLS connections
that present a client certificate signed by that authority. So one successful
``cortex.connect`` proves ``sslmode=verify-full``, ``sslrootcert``, ``sslcert``
and ``sslkey`` all reached the driver with libpq's meaning.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import anyio
import pytest
import sqlalchemy as sa

import cortex
from cortex import use_scope
from cortex.migrate import upgrade
from tests.conftest import Database, with_query

pytestmark = pytest.mark.sqlalchemy20

_BIN = Path(os.environ.get("CORTEX_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


async def _setting(store: cortex.Store, expression: str) -> object:
    async with store.engine.connect() as conn:
        return await conn.scalar(sa.text(f"SELECT {expression}"))


async def test_application_name_options_and_timeout(database: Database, tenant: str) -> None:
    url = with_query(
        database.app_url,
        "application_name=cortex-url-test&connect_timeout=5"
        "&options=-c%20statement_timeout%3D4321&sslmode=disable&target_session_attrs=read-write",
    )
    async with cortex.connect(url) as store:
        assert await _setting(store, "current_setting('application_name')") == "cortex-url-test"
        assert await _setting(store, "current_setting('statement_timeout')") == "4321ms"
        with use_scope(tenant):
            created = await store.create_session("bot")
            assert (await store.get_session(created.id)).id == created.id


async def test_unknown_parameter_is_refused_before_connecting(database: Database) -> None:
    with pytest.raises(cortex.InvalidInput, match="keepalives"):
        async with cortex.connect(with_query(database.app_url, "keepalives=1")):
            pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(folder: Path) -> None:
    """A CA, a server certificate for 127.0.0.1, a client certificate for postgres, a stranger CA."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for ca in ("ca", "stranger"):
        _openssl("req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                 "-days", "2", "-subj", f"/CN=cortex test {ca}", cwd=folder)  # fmt: skip
    for name, cn, ext in (
        ("server", "127.0.0.1", "subjectAltName=IP:127.0.0.1"),
        ("client", "postgres", "keyUsage=digitalSignature"),
    ):
        _openssl("req", "-new", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={cn}", cwd=folder)  # fmt: skip
        (folder / f"{name}.ext").write_text(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", f"{name}.ext", cwd=folder)  # fmt: skip
    for key in folder.glob("*.key"):
        key.chmod(0o600)


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[str, Path]]:
    """A PostgreSQL of the test's own that requires TLS with a client certificate.

    Yields its URL without query and the folder holding the certificates.
    """
    if not (_BIN / "initdb").exists() or shutil.which("openssl") is None:
        message = f"no PostgreSQL binaries at {_BIN} or no openssl"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI must run the TLS test)")
        pytest.skip(message)
    as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    base = Path(tempfile.mkdtemp(prefix="cortex-tls-"))
    base.chmod(0o755)
    certs, data = base / "certs", base / "data"
    certs.mkdir()
    _certificates(certs)
    port = _free_port()
    if as_postgres:
        shutil.chown(base, "postgres")
        for path in [certs, *certs.iterdir()]:
            shutil.chown(path, "postgres")

    def run(*args: str) -> None:
        subprocess.run([*as_postgres, *args], check=True, capture_output=True)

    run(str(_BIN / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write(
            f"port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{base}'\n"
            f"ssl = on\nssl_cert_file = '{certs}/server.crt'\nssl_key_file = '{certs}/server.key'\n"
            f"ssl_ca_file = '{certs}/ca.crt'\n"
        )
    (data / "pg_hba.conf").write_text(
        "local all all trust\n"
        "hostssl all postgres 127.0.0.1/32 cert\n"
        "hostnossl all all 127.0.0.1/32 reject\n"
    )
    run(str(_BIN / "pg_ctl"), "-D", str(data), "-w", "-l", str(base / "log"), "start")
    try:
        # The test (the client) reads the client key: as root it can, and files it made are its own.
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres", certs
    finally:
        run(str(_BIN / "pg_ctl"), "-D", str(data), "-w", "-m", "immediate", "stop")
        shutil.rmtree(base, ignore_errors=True)


def _tls(url: str, certs: Path, *, root: str = "ca.crt", mode: str = "verify-full") -> str:
    files = {"sslrootcert": root, "sslcert": "client.crt", "sslkey": "client.key"}
    query = "&".join(f"{k}={quote(str(certs / v), safe='')}" for k, v in files.items())
    return with_query(url, f"sslmode={mode}&{query}&application_name=cortex-tls")


def test_verified_tls_with_a_client_certificate(tls_server: tuple[str, Path]) -> None:
    url, certs = tls_server
    upgrade(_tls(url, certs))  # Alembic goes through the same translation

    async def use() -> None:
        async with cortex.connect(_tls(url, certs)) as store:
            assert await _setting(store, "ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            assert await _setting(store, "current_setting('application_name')") == "cortex-tls"
            with use_scope("tls"):
                created = await store.create_session("bot")
                assert (await store.get_session(created.id)).id == created.id

    anyio.run(use)


@pytest.mark.parametrize(
    ("root", "mode"),
    [("stranger.crt", "verify-full"), ("ca.crt", "disable")],
    ids=["server-cert-from-another-ca", "no-tls"],
)
def test_tls_failures_are_database_unavailable(
    tls_server: tuple[str, Path], root: str, mode: str
) -> None:
    url, certs = tls_server

    async def use() -> None:
        async with cortex.connect(_tls(url, certs, root=root, mode=mode)):
            pass

    with pytest.raises(cortex.DatabaseUnavailable):
        anyio.run(use)
