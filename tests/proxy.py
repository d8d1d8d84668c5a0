"""A TCP proxy in front of PostgreSQL that can drop a connection right after it forwards COMMIT.

It also counts the round trips its clients make (``round_trips``).

It speaks just enough of the frontend protocol to find message boundaries:
the untyped startup packets (SSLRequest, GSSENCRequest, StartupMessage), then
typed messages (one type byte, an int32 length). When armed, the first
simple-protocol ``Query`` that starts with ``COMMIT`` is forwarded to the
server whole, and then the client's socket is closed before any reply: the
server commits, the client sees a lost connection. That is the ambiguous
commit a retry must survive.

Clients reach it on 127.0.0.1 (:meth:`CommitDropProxy.client_url`); it
reaches the server the way the server's URL says: on TCP, or on the unix
socket a ``?host=<socket folder>`` names (the embedded server listens on
nothing else).
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import AsyncIterator

from tests.conftest import on_local_port, server_address

_SPECIAL_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest


class CommitDropProxy:
    """Forward connections to the server of ``server_url``; ``arm()`` makes the next COMMIT ambiguous."""

    def __init__(self, server_url: str) -> None:
        self.host, self.port = server_address(server_url)
        self.armed = 0
        self.dropped = 0
        # Requests the clients waited on: a simple Query, or a Sync ending an
        # extended-protocol batch (Parse/Bind/Execute).
        self.round_trips = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def listen_port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def client_url(self, url: str) -> str:
        """``url`` (same login, database and parameters) through the proxy."""
        return on_local_port(url, self.listen_port)

    async def _open_server(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.host.startswith("/"):
            return await asyncio.open_unix_connection(f"{self.host}/.s.PGSQL.{self.port}")
        return await asyncio.open_connection(self.host, self.port)

    def arm(self, times: int = 1) -> None:
        """Drop the connection after each of the next ``times`` COMMITs."""
        self.armed += times

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        # Closing the sockets ends every connection's task; cancelling the
        # tasks instead would make asyncio log each one as an error.
        for writer in list(self._writers):
            writer.close()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            server_r, server_w = await self._open_server()
        except OSError:
            client_w.close()
            self._tasks.discard(task)
            return
        self._writers.update((client_w, server_w))
        back = asyncio.create_task(self._pipe(server_r, client_w))
        try:
            await self._forward(client_r, server_w, client_w)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            client_w.close()
            # Let the server finish what it was sent (the COMMIT) before it sees EOF.
            await asyncio.sleep(0.05)
            server_w.close()
            self._writers.difference_update((client_w, server_w))
            back.cancel()
            with contextlib.suppress(BaseException):
                await back
            self._tasks.discard(task)

    async def _forward(
        self,
        reader: asyncio.StreamReader,
        to_server: asyncio.StreamWriter,
        client_w: asyncio.StreamWriter,
    ) -> None:
        # Startup phase: untyped packets until the StartupMessage.
        while True:
            head = await reader.readexactly(8)
            length, code = struct.unpack("!ii", head)
            body = await reader.readexactly(length - 8)
            to_server.write(head + body)
            await to_server.drain()
            if code not in _SPECIAL_REQUESTS:
                break
        while True:
            head = await reader.readexactly(5)
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = await reader.readexactly(length - 4)
            to_server.write(head + body)
            await to_server.drain()
            if kind == b"X":
                return
            if kind in (b"Q", b"S"):
                self.round_trips += 1
            if self.armed and kind == b"Q" and body.lstrip().upper().startswith(b"COMMIT"):
                self.armed -= 1
                self.dropped += 1
                return  # the caller closes the client side: the reply never arrives

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while data := await reader.read(65536):
                if writer.is_closing():
                    continue  # drain the server's reply into nowhere
                writer.write(data)
                await writer.drain()


@contextlib.asynccontextmanager
async def commit_drop_proxy(server_url: str) -> AsyncIterator[CommitDropProxy]:
    """A started proxy in front of the server of ``server_url``, closed on exit."""
    proxy = CommitDropProxy(server_url)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()
