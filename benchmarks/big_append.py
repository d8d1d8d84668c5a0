"""Scenario ``big_append``: the largest append cortex accepts, and the client memory it takes.

``python -m benchmarks.big_append [--dsn URL] [--messages 64] [--content-bytes 1048512]``

One ``append_messages`` of ``--messages`` messages of ``--content-bytes``
each (default: 64 x (1 MiB - 64 bytes), just under the 64 MiB batch limit) into a fresh session, run
in a child process of its own so that its peak resident set size
(``ru_maxrss``) belongs to this append alone. Printed: the process's peak
before the append (the interpreter, cortex, and the batch the caller built)
and after it; the difference is what the append itself cost the client.
Benchmarks measure; this one never passes or fails on a number.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import subprocess
import sys
import time
from typing import Any

import cortex
from benchmarks._common import bench_database
from cortex import NewMessage, use_scope

MIB = 1024 * 1024


def _peak_mib() -> float:
    # Linux reports ru_maxrss in KiB.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def _child(url: str, messages: int, content_bytes: int) -> dict[str, Any]:
    async with cortex.connect(url, pool_size=1) as store:
        with use_scope("bench/big"):
            session = await store.create_session("bench")
            await store.append_messages(session.id, [NewMessage("user", "warm-up")])
            # Distinct strings, as a caller's real messages would be.
            batch = [
                NewMessage("user", chr(ord("a") + i % 26) * content_bytes) for i in range(messages)
            ]
            before = _peak_mib()
            started = time.perf_counter()
            stored = await store.append_messages(session.id, batch)
            seconds = time.perf_counter() - started
            after = _peak_mib()
            assert len(stored) == messages
    return {
        "messages": messages,
        "batch_mib": round(messages * content_bytes / MIB, 1),
        "peak_before_mib": round(before, 1),
        "peak_after_mib": round(after, 1),
        "append_cost_mib": round(after - before, 1),
        "seconds": round(seconds, 2),
    }


async def _parent(dsn: str, messages: int, content_bytes: int) -> dict[str, Any]:
    async with bench_database(dsn) as db:
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.big_append",
            "--child",
            db.app_url,
            "--messages",
            str(messages),
            "--content-bytes",
            str(content_bytes),
        ]
        out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"the measuring process failed:\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.big_append", description=__doc__)
    parser.add_argument("--dsn", help="superuser URL (default: $CORTEX_DATABASE_URL)")
    parser.add_argument("--messages", type=int, default=64)
    # Just under 1 MiB each, so that 64 of them with their "{}" metadata fill
    # the 64 MiB batch limit without passing it.
    parser.add_argument("--content-bytes", type=int, default=MIB - 64)
    parser.add_argument("--json", help="also write the result to this file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(asyncio.run(_child(args.child, args.messages, args.content_bytes))))
        return 0
    dsn = args.dsn or os.environ.get("CORTEX_DATABASE_URL")
    if not dsn:
        parser.error("--dsn or CORTEX_DATABASE_URL is required")
    result = asyncio.run(_parent(dsn, args.messages, args.content_bytes))
    print(
        f"append of {result['messages']} messages, {result['batch_mib']} MiB:"
        f" client peak RSS {result['peak_before_mib']} MiB before,"
        f" {result['peak_after_mib']} MiB after"
        f" (+{result['append_cost_mib']} MiB for the append), {result['seconds']} s"
    )
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
