"""Scenario ``server``: appends and listing pages through ``cortex serve``, beside the Store.

``cortex serve`` runs in a subprocess (one uvicorn worker, its own CPU) on a
loopback port; a load generator (``httpx.AsyncClient``, one connection per
worker) calls it with a bearer token while the same calls run on a
:class:`cortex.Store` in this process, against the same database, in
alternating blocks. Measured:

- appends of one message, C workers each on its own session: the HTTP rate
  beside the Store's (``ratio``: HTTP / Store);
- a page of 50 sessions (``GET /v1/sessions``, ``list_sessions_page``) and a
  page of 100 messages (``GET .../messages``, ``list_messages``), one call at
  a time and with C workers: p50 and p99 (``ratio``: HTTP p50 / Store p50).

The server process's CPU per call is read from ``/proc`` (psutil) for each
block. After the run every session's ``message_count`` must equal its rows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import psutil

import cortex
from benchmarks._common import BenchDatabase, Side, alternate, timed_workers
from benchmarks.append import check_invariants
from cortex import ListFilter, NewMessage, use_scope
from cortex.scope import Scope
from cortex.server import SigningKey, issue_token

SCOPE = Scope.parse("bench/team/user")
TEXT = "hello from the benchmark"
# What each kind of line is held to (docs/benchmarks.md).
APPEND_TARGET = 0.5  # HTTP appends/s at least this multiple of the Store's
PAGE_TARGET = 2.0  # an HTTP page's p50 at most this multiple of the Store's


@dataclass(frozen=True)
class Params:
    n: int = 4000  # appends per side
    concurrency: int = 8  # load generator workers (and Store tasks)
    sessions: int = 1000  # sessions listed by the page lines
    messages: int = 500  # messages in the session the message page reads
    repeats: int = 400  # page calls per side per line
    blocks: int = 4


@dataclass
class Server:
    """``cortex serve`` in a subprocess, and what the load generator needs to call it."""

    base_url: str
    headers: dict[str, str]
    process: psutil.Process

    def cpu_seconds(self) -> float:
        """User and system CPU the server process has used so far."""
        times = self.process.cpu_times()
        return float(times.user + times.system)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@asynccontextmanager
async def serve(app_url: str) -> AsyncIterator[Server]:
    """Run ``cortex serve`` on a free loopback port until it answers ``/readyz``; stop it after."""
    key = secrets.token_urlsafe(32)
    port = _free_port()
    env = {**os.environ, "CORTEX_SIGNING_KEY": key}
    command = [sys.executable, "-m", "cortex", "serve", "--port", str(port)]
    command += ["--database-url", app_url]
    child = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.DEVNULL
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        await _ready(base_url, child)
        token = issue_token(SigningKey.parse(key), scope=str(SCOPE), ttl=24 * 3600)
        yield Server(base_url, {"Authorization": f"Bearer {token}"}, psutil.Process(child.pid))
    finally:
        child.terminate()
        try:
            await asyncio.wait_for(child.wait(), 30)
        except TimeoutError:
            child.kill()
            await child.wait()


async def _ready(base_url: str, child: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 60
    async with httpx.AsyncClient(base_url=base_url) as client:
        while True:
            if child.returncode is not None:
                raise RuntimeError(f"cortex serve exited with {child.returncode}")
            try:
                if (await client.get("/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("cortex serve did not become ready in 60 s")
            await asyncio.sleep(0.1)


@dataclass
class Cpu:
    """CPU seconds of the server process and of this (client) process, over one side's blocks."""

    server: float = 0.0
    client: float = 0.0


def _line(
    name: str,
    kind: str,
    http: Side,
    store: Side,
    cpu: dict[str, Cpu],
) -> dict[str, Any]:
    h, s = http.summary(), store.summary()
    if kind == "throughput":
        ratio = h["ops_per_s"] / s["ops_per_s"]
        target = f"HTTP rate >= {APPEND_TARGET}x the Store's"
        meets = ratio >= APPEND_TARGET
    else:
        ratio = h["p50_ms"] / s["p50_ms"]
        target = f"HTTP p50 <= {PAGE_TARGET}x the Store's"
        meets = ratio <= PAGE_TARGET
    return {
        "name": name,
        "kind": kind,
        "http": h,
        "store": s,
        "ratio": ratio,
        "p99_ratio": h["p99_ms"] / s["p99_ms"],
        "target": target,
        "meets_target": meets,
        # Per call: the server process's CPU (HTTP side), and this process's on each side.
        "server_cpu_us_per_call": cpu["http"].server / http.ops * 1e6,
        "client_cpu_us_per_call": {
            "http": cpu["http"].client / http.ops * 1e6,
            "store": cpu["store"].client / store.ops * 1e6,
        },
    }


def _print(line: dict[str, Any]) -> None:
    h, s = line["http"], line["store"]
    print(
        f"  {line['name']:<46} http {h['ops_per_s']:7.0f}/s p50 {h['p50_ms']:6.2f} p99 {h['p99_ms']:6.2f} ms"
        f" | store {s['ops_per_s']:7.0f}/s p50 {s['p50_ms']:6.2f} p99 {s['p99_ms']:6.2f} ms"
        f" | ratio {line['ratio']:4.2f} ({'meets' if line['meets_target'] else 'MISSES'}:"
        f" {line['target']}) | server CPU {line['server_cpu_us_per_call']:.0f} us/call"
    )


async def _measured(
    blocks: int,
    server: Server,
    http_block: Callable[[], Awaitable[None]],
    store_block: Callable[[], Awaitable[None]],
) -> dict[str, Cpu]:
    """Alternate the two sides' blocks, adding up each side's CPU (server and client)."""
    cpu = {"http": Cpu(), "store": Cpu()}

    def counted(side: str, block: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            server_before, client_before = server.cpu_seconds(), time.process_time()
            await block()
            cpu[side].server += server.cpu_seconds() - server_before
            cpu[side].client += time.process_time() - client_before

        return run

    await alternate(blocks, counted("http", http_block), counted("store", store_block))
    return cpu


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    lines: list[dict[str, Any]] = []
    c = p.concurrency
    halves = p.blocks // 2 or 1
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with (
        serve(db.app_url) as server,
        cortex.connect(db.app_url) as store,
        httpx.AsyncClient(
            base_url=server.base_url, headers=server.headers, limits=limits, timeout=60
        ) as client,
    ):
        with use_scope(SCOPE):
            own = [(await store.create_session("bench")).id for _ in range(c)]
            listed = [(await store.create_session("bench")).id for _ in range(p.sessions)]
            for sid in listed[:: max(1, len(listed) // 50)]:
                await store.append_messages(sid, [NewMessage("user", TEXT)])
            long = listed[0]
            for start in range(0, p.messages, 500):
                batch = [NewMessage("user", TEXT)] * min(500, p.messages - start)
                await store.append_messages(long, batch)
        body = {"messages": [{"role": "user", "content": TEXT}]}
        one = [NewMessage("user", TEXT)]

        # Appends: C workers, each on its own session, on both sides.
        async def http_append(w: int, i: int) -> int:
            response = await client.post(f"/v1/sessions/{own[w]}/messages", json=body)
            response.raise_for_status()
            return 1

        async def store_append(w: int, i: int) -> int:
            with use_scope(SCOPE):
                await store.append_messages(own[w], one)
            return 1

        per_worker = max(1, p.n // c // halves)
        http, local = Side(), Side()
        cpu = await _measured(
            p.blocks,
            server,
            partial(timed_workers, http, c, per_worker, http_append),
            partial(timed_workers, local, c, per_worker, store_append),
        )
        lines.append(_line(f"append one message, {c} workers", "throughput", http, local, cpu))
        _print(lines[-1])

        # Pages: each read once outside the timing (statement caches, connections).
        async def http_sessions(w: int, i: int) -> int:
            response = await client.get("/v1/sessions", params={"limit": 50})
            response.raise_for_status()
            return 1

        async def store_sessions(w: int, i: int) -> int:
            with use_scope(SCOPE):
                await store.list_sessions_page(ListFilter(limit=50))
            return 1

        async def http_messages(w: int, i: int) -> int:
            response = await client.get(f"/v1/sessions/{long}/messages", params={"limit": 100})
            response.raise_for_status()
            return 1

        async def store_messages(w: int, i: int) -> int:
            with use_scope(SCOPE):
                await store.list_messages(long, limit=100)
            return 1

        pages: list[tuple[str, Any, Any]] = [
            ("a page of 50 sessions", http_sessions, store_sessions),
            ("a page of 100 messages", http_messages, store_messages),
        ]
        for label, http_op, store_op in pages:
            for workers in (1, c):
                await http_op(0, 0)
                await store_op(0, 0)
                calls = max(1, p.repeats // workers // halves)
                http, local = Side(), Side()
                cpu = await _measured(
                    p.blocks,
                    server,
                    partial(timed_workers, http, workers, calls, http_op),
                    partial(timed_workers, local, workers, calls, store_op),
                )
                who = "one call at a time" if workers == 1 else f"{workers} workers"
                lines.append(_line(f"{label}, {who}", "latency", http, local, cpu))
                _print(lines[-1])
    broken = await check_invariants(db.owner_url)
    if broken:
        print(f"!!! INVARIANT BROKEN: {len(broken)} sessions, e.g. {broken[:3]}")
    return lines, not broken
