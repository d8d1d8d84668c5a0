"""Scenario ``server``: appends and listing pages through ``cortex serve``, beside the Store.

``cortex serve`` runs in a subprocess (one uvicorn worker, its own CPU) on a
loopback port; a load generator calls it with a bearer token, one
keep-alive connection per worker, while the same calls run on a
:class:`cortex.Store` in this process, against the same database, in
alternating blocks. The generator is ``wrk`` when it is on the ``PATH`` (a C
process of its own: it measures the server, not itself, and each of its
threads holds one connection), else ``httpx.AsyncClient`` in this process
(whose own CPU then competes with the server's); the report names it. The
Store side is timed in process, the HTTP side end to end over loopback.
With ``baseline`` (a source tree, e.g. a checkout of an earlier commit) a
second ``cortex serve`` runs from it as a third side, in the same rotation.
Measured:

- appends of one message, C workers each on its own session: the HTTP rate
  beside the Store's (``ratio``: HTTP / Store);
- a page of 50 sessions (``GET /v1/sessions``, ``list_sessions_page``) and a
  page of 100 messages (``GET .../messages``, ``list_messages``), one call at
  a time and with C workers: p50 and p99 (``ratio``: HTTP p50 / Store p50).

The server process's CPU per call is read from ``/proc`` (psutil) for each
block, the generator's too (``wrk``'s from its rusage). After the run every
session's ``message_count`` must equal its rows.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx
import psutil

import cortex
from benchmarks._common import BenchDatabase, Side, rotate, timed_workers
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
    seconds: int = 3  # each wrk block's length (wrk runs for a time, not a count)
    generator: str = "auto"  # wrk, httpx, or auto: wrk when it is on the PATH
    metrics: bool = True  # cortex serve's telemetry (its default); False: --no-metrics
    baseline: str | None = None  # a source tree whose cortex serve runs as a third side


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
async def serve(
    app_url: str, *, metrics: bool = True, source: str | None = None
) -> AsyncIterator[Server]:
    """Run ``cortex serve`` (from ``source``, a source tree, if given) until it answers ``/readyz``."""
    key = secrets.token_urlsafe(32)
    port = _free_port()
    env = {**os.environ, "CORTEX_SIGNING_KEY": key}
    if source is not None:
        env["PYTHONPATH"] = source
    command = [sys.executable, "-m", "cortex", "serve", "--port", str(port)]
    command += ["--database-url", app_url]
    if not metrics:
        command.append("--no-metrics")
    # In the source tree: ``python -m`` puts the working directory first on sys.path.
    child = await asyncio.create_subprocess_exec(
        *command, env=env, cwd=source, stdout=asyncio.subprocess.DEVNULL
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


@dataclass(frozen=True)
class Call:
    """One HTTP call the generator repeats: worker ``w`` sends it to ``paths[w % len(paths)]``."""

    method: str
    paths: list[str]  # with the query string
    body: bytes | None = None


def _lua(value: str) -> str:
    """A Lua string literal (JSON's escapes are Lua's, for ASCII text)."""
    literal = json.dumps(value, ensure_ascii=True)
    assert "\\u" not in literal, value  # no escape Lua lacks
    return literal


# wrk (https://github.com/wg/wrk): each thread holds one connection and sends
# its worker's request; done() writes the counts and the latency histogram
# (microseconds, every distinct value with its count) for this process to read.
_WRK_SCRIPT = """
local paths = {%(paths)s}
local body = %(body)s
local method = %(method)s
local headers = {%(headers)s}
local out = %(out)s
local threads = 0
function setup(thread)
  thread:set("index", threads)
  threads = threads + 1
end
function init(args)
  prepared = wrk.format(method, paths[(index %% #paths) + 1], headers, body)
end
function request()
  return prepared
end
function done(summary, latency, requests)
  local f = io.open(out, "w")
  local e = summary.errors
  f:write(string.format("%%d %%d %%d %%d %%d %%d %%d\\n", summary.requests, summary.duration,
    e.connect, e.read, e.write, e.status, e.timeout))
  for i = 1, #latency do
    local v, c = latency(i)
    f:write(string.format("%%d %%d\\n", v, c))
  end
  f:close()
end
"""


def _write_script(script: str, call: Call, headers: dict[str, str], out: str) -> None:
    if call.body is not None:
        headers["Content-Type"] = "application/json"
    with open(script, "w") as f:
        f.write(
            _WRK_SCRIPT
            % {
                "paths": ", ".join(_lua(path) for path in call.paths),
                "body": "nil" if call.body is None else _lua(call.body.decode()),
                "method": _lua(call.method),
                "headers": ", ".join(f"[{_lua(k)}] = {_lua(v)}" for k, v in headers.items()),
                "out": _lua(out),
            }
        )


def _read_out(path: str) -> tuple[int, int, list[int], list[tuple[int, ...]]]:
    """What the script's done() wrote: requests, microseconds, errors, the histogram."""
    with open(path) as f:
        requests, micros, *errors = (int(x) for x in f.readline().split())
        return requests, micros, errors, [tuple(int(x) for x in line.split()) for line in f]


async def wrk_block(
    side: Side, server: Server, call: Call, workers: int, seconds: int, wrk: str
) -> None:
    """``wrk`` with ``workers`` threads of one connection each, for ``seconds``; into ``side``."""
    with tempfile.TemporaryDirectory(prefix="cortex-wrk-") as tmp:
        out, script = os.path.join(tmp, "out"), os.path.join(tmp, "script.lua")
        _write_script(script, call, {**server.headers}, out)
        command = [wrk, f"-t{workers}", f"-c{workers}", f"-d{seconds}s", "--timeout", "10s"]
        child = await asyncio.create_subprocess_exec(
            *command,
            "-s",
            script,
            server.base_url,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        _, stderr = await child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"wrk exited with {child.returncode}: {stderr.decode()}")
        requests, micros, errors, histogram = _read_out(out)
    if any(errors):
        raise RuntimeError(
            f"wrk: errors (connect, read, write, status, timeout) {errors} on {call.method}"
            f" {call.paths[0]}"
        )
    side.ops += requests
    side.wall += micros / 1e6
    for value, count in histogram:
        side.latencies.extend([value / 1e6] * count)


def _children_cpu() -> float:
    """CPU of this process's reaped children so far (wrk; the servers still run)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Cpu:
    """CPU seconds of the server process and of the client (this process and wrk), over one side's blocks."""

    server: float = 0.0
    client: float = 0.0


def _line(
    name: str,
    kind: str,
    sides: dict[str, Side],
    cpu: dict[str, Cpu],
) -> dict[str, Any]:
    h, s = sides["http"].summary(), sides["store"].summary()
    if kind == "throughput":
        ratio = h["ops_per_s"] / s["ops_per_s"]
        target = f"HTTP rate >= {APPEND_TARGET}x the Store's"
        meets = ratio >= APPEND_TARGET
    else:
        ratio = h["p50_ms"] / s["p50_ms"]
        target = f"HTTP p50 <= {PAGE_TARGET}x the Store's"
        meets = ratio <= PAGE_TARGET
    line: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "http": h,
        "store": s,
        "ratio": ratio,
        "p99_ratio": h["p99_ms"] / s["p99_ms"],
        "target": target,
        "meets_target": meets,
        # Per call: the server process's CPU (HTTP side), and the client's on each side.
        "server_cpu_us_per_call": cpu["http"].server / sides["http"].ops * 1e6,
        "client_cpu_us_per_call": {
            side: cpu[side].client / sides[side].ops * 1e6 for side in sides
        },
    }
    if "baseline" in sides:
        b = sides["baseline"].summary()
        line["baseline"] = b
        line["baseline_ratio"] = (
            b["ops_per_s"] / s["ops_per_s"] if kind == "throughput" else b["p50_ms"] / s["p50_ms"]
        )
        line["baseline_server_cpu_us_per_call"] = (
            cpu["baseline"].server / sides["baseline"].ops * 1e6
        )
    return line


def _print(line: dict[str, Any]) -> None:
    h, s = line["http"], line["store"]
    print(
        f"  {line['name']:<46} http {h['ops_per_s']:7.0f}/s p50 {h['p50_ms']:6.2f} p99 {h['p99_ms']:6.2f} ms"
        f" | store {s['ops_per_s']:7.0f}/s p50 {s['p50_ms']:6.2f} p99 {s['p99_ms']:6.2f} ms"
        f" | ratio {line['ratio']:4.2f} ({'meets' if line['meets_target'] else 'MISSES'}:"
        f" {line['target']}) | server CPU {line['server_cpu_us_per_call']:.0f} us/call"
    )
    if "baseline" in line:
        b = line["baseline"]
        print(
            f"  {'  baseline':<46} http {b['ops_per_s']:7.0f}/s p50 {b['p50_ms']:6.2f} p99"
            f" {b['p99_ms']:6.2f} ms | ratio {line['baseline_ratio']:4.2f} | server CPU"
            f" {line['baseline_server_cpu_us_per_call']:.0f} us/call"
        )


async def _measured(
    blocks: int,
    servers: dict[str, Server],
    sides: dict[str, Callable[[], Awaitable[None]]],
) -> dict[str, Cpu]:
    """Rotate the sides' blocks, adding up each side's CPU (its server's and the client's)."""
    cpu = {side: Cpu() for side in sides}

    def counted(side: str, block: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        server = servers.get(side, servers["http"])

        async def run() -> None:
            server_before = server.cpu_seconds()
            client_before = time.process_time() + _children_cpu()
            await block()
            cpu[side].server += server.cpu_seconds() - server_before
            cpu[side].client += time.process_time() + _children_cpu() - client_before

        return run

    await rotate(blocks, [counted(side, block) for side, block in sides.items()])
    return cpu


def generator(p: Params) -> str | None:
    """The path of ``wrk`` if it is the generator, else None (httpx)."""
    if p.generator == "httpx":
        return None
    found = shutil.which("wrk")
    if found is None and p.generator == "wrk":
        raise RuntimeError("--generator wrk: wrk is not on the PATH")
    return found


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    lines: list[dict[str, Any]] = []
    c = p.concurrency
    halves = p.blocks // 2 or 1
    wrk = generator(p)
    print(f"  generator: {wrk or 'httpx.AsyncClient'}; metrics {'on' if p.metrics else 'off'}")
    limits = httpx.Limits(max_connections=c, max_keepalive_connections=c)
    async with AsyncExitStack() as stack:
        servers = {"http": await stack.enter_async_context(serve(db.app_url, metrics=p.metrics))}
        if p.baseline is not None:
            servers["baseline"] = await stack.enter_async_context(
                serve(db.app_url, metrics=p.metrics, source=p.baseline)
            )
        store = await stack.enter_async_context(cortex.connect(db.app_url))
        clients = {
            side: await stack.enter_async_context(
                httpx.AsyncClient(
                    base_url=server.base_url, headers=server.headers, limits=limits, timeout=60
                )
            )
            for side, server in servers.items()
        }
        with use_scope(SCOPE):
            own = [(await store.create_session("bench")).id for _ in range(c * len(servers) + c)]
            listed = [(await store.create_session("bench")).id for _ in range(p.sessions)]
            for sid in listed[:: max(1, len(listed) // 50)]:
                await store.append_messages(sid, [NewMessage("user", TEXT)])
            long = listed[0]
            for start in range(0, p.messages, 500):
                batch = [NewMessage("user", TEXT)] * min(500, p.messages - start)
                await store.append_messages(long, batch)
        # Every side appends to sessions of its own: no two appends wait on one session's lock.
        owned = {side: own[i * c : (i + 1) * c] for i, side in enumerate(["store", *servers])}
        body = json.dumps({"messages": [{"role": "user", "content": TEXT}]}).encode()
        one = [NewMessage("user", TEXT)]

        def http_block(side: str, call: Call, workers: int, calls: int, into: Side) -> Any:
            if wrk is not None:
                return partial(wrk_block, into, servers[side], call, workers, p.seconds, wrk)
            client = clients[side]

            async def op(w: int, i: int) -> int:
                response = await client.request(
                    call.method,
                    call.paths[w % len(call.paths)],
                    content=call.body,
                    headers=None if call.body is None else {"Content-Type": "application/json"},
                )
                response.raise_for_status()
                return 1

            return partial(timed_workers, into, workers, calls, op)

        async def measure(
            name: str,
            kind: str,
            calls: dict[str, Call],
            store_op: Callable[[int, int], Awaitable[int]],
            workers: int,
            per_worker: int,
        ) -> None:
            sides = {side: Side() for side in [*servers, "store"]}
            blocks = {
                side: http_block(side, calls[side], workers, per_worker, sides[side])
                for side in servers
            }
            blocks["store"] = partial(timed_workers, sides["store"], workers, per_worker, store_op)
            cpu = await _measured(p.blocks, servers, blocks)
            lines.append(_line(name, kind, sides, cpu))
            lines[-1]["generator"] = "wrk" if wrk else "httpx"
            lines[-1]["metrics"] = p.metrics
            _print(lines[-1])

        # Appends: C workers, each on its own session, on every side.
        async def store_append(w: int, i: int) -> int:
            with use_scope(SCOPE):
                await store.append_messages(owned["store"][w], one)
            return 1

        appends = {
            side: Call("POST", [f"/v1/sessions/{sid}/messages" for sid in owned[side]], body)
            for side in servers
        }
        per_worker = max(1, p.n // c // halves)
        await measure(
            f"append one message, {c} workers", "throughput", appends, store_append, c, per_worker
        )

        # Pages: each read once outside the timing (statement caches, connections).
        async def store_sessions(w: int, i: int) -> int:
            with use_scope(SCOPE):
                await store.list_sessions_page(ListFilter(limit=50))
            return 1

        async def store_messages(w: int, i: int) -> int:
            with use_scope(SCOPE):
                await store.list_messages(long, limit=100)
            return 1

        pages: list[tuple[str, str, Any]] = [
            ("a page of 50 sessions", "/v1/sessions?limit=50", store_sessions),
            ("a page of 100 messages", f"/v1/sessions/{long}/messages?limit=100", store_messages),
        ]
        for label, path, store_op in pages:
            call = Call("GET", [path])
            for workers in (1, c):
                for client in clients.values():
                    (await client.get(path)).raise_for_status()
                await store_op(0, 0)
                calls = max(1, p.repeats // workers // halves)
                who = "one call at a time" if workers == 1 else f"{workers} workers"
                await measure(
                    f"{label}, {who}",
                    "latency",
                    dict.fromkeys(servers, call),
                    store_op,
                    workers,
                    calls,
                )
    broken = await check_invariants(db.owner_url)
    if broken:
        print(f"!!! INVARIANT BROKEN: {len(broken)} sessions, e.g. {broken[:3]}")
    return lines, not broken
