"""Fill a migrated cortex database with a large, deterministic, skewed data set, fast.

Usage::

    python -m benchmarks.seed --dsn postgresql://postgres@127.0.0.1:5432/cortex_plans --sessions 1000000

Everything is set-based: one ``INSERT ... SELECT FROM generate_series`` per chunk
of sessions (and one per chunk for their messages), never a row at a time. Every
value is a pure function of the session's row number ``n`` (hash-based
pseudo-randomness, ``hashint8extended(n, k)``), so two runs with the same
arguments produce the same rows, ids included.

Row-level security: ``sessions`` and ``messages`` FORCE RLS, so even the table
owner sees and writes nothing without a bound tenant. The seeder therefore
connects as a **superuser** (or a BYPASSRLS role), which PostgreSQL exempts
from every policy; it checks this up front and refuses otherwise. The schema
is not touched (no ``NO FORCE ROW LEVEL SECURITY``). The same privilege lets it
set ``session_replication_role = replica`` for the message chunks, which skips
the per-row foreign-key triggers: the rows are consistent by construction
(each message's session is inserted by the earlier sessions chunk).

Data shape (the one docs/query-plans.md and the design research use):

* 100 tenants ``org0 .. org99``; ``org0`` holds ~20 % of the sessions, the
  other 99 share the rest evenly;
* 20 projects per tenant (``orgN/projM``), 50 users per project
  (``orgN/projM/userK``); depth mix ~2 % tenant-level, ~8 % project-level,
  ~90 % user-level; ``tenant_id``, ``scope``, ``scope_depth``, ``scope_l2``, ``scope_l3``
  are filled exactly as ``cortex._calls.sessions.scope_columns`` does;
* agents ``agent-0 .. agent-4`` round robin (``n % 5``);
* ``updated_at`` uniform over the 90 days before ``ANCHOR``, ``created_at``
  0-7 days earlier;
* titles of 3-4 and last messages of 10-16 pseudo-words drawn Zipf-like from
  a generated vocabulary of 1,000 English-like words (none contains
  ``invoice``, ``zanzibar`` or ``off``); ~1 % of last messages contain
  ``invoice 50%_off`` and ~0.01 % contain ``zanzibar``;
* exactly one ``is_default`` session for ~30 % of the distinct
  (tenant_id, agent_id, scope) triples (the oldest row of the triple; the
  partial unique index ``uq_sessions_default`` holds);
* ``messages_per_session`` messages per session, ``seq`` 1..n gap-free,
  alternating user/assistant, spread from ``created_at`` to ``updated_at``;
  the last one's content is the session's ``last_message`` and its
  ``created_at`` the session's ``updated_at``, and ``message_count`` = n;
* ids are UUIDv7: the 48-bit millisecond timestamp of the row's
  ``created_at``, the rest from ``md5`` of the row number;
* with ``metadata=True``, every session's metadata is a compact JSON object
  of about 110 bytes (:data:`METADATA_SHAPE`), as cortex writes it into
  ``metadata_json``: ``channel`` is ``"web"`` for ~1 % of the sessions of
  every tenant and one of four others otherwise, ``priority`` 0-2, a nested
  ``customer`` object and a ``tags`` array. Without it, metadata is ``{}``
  (the legacy jsonb column's default, ``metadata_json`` NULL).

Afterwards both tables are ``VACUUM ANALYZE``-d (visibility map and statistics
ready for index-only scans and plans), and the timings are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Final

import asyncpg
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cortex._db.engine import driver_dsn

__all__ = ["ANCHOR", "CHUNK", "METADATA_SHAPE", "main", "seed", "vocabulary"]

# updated_at lies in the 90 days before this instant (fixed, so runs repeat exactly).
ANCHOR: Final = datetime(2026, 9, 1, tzinfo=UTC)
# Sessions per INSERT statement (messages: CHUNK * messages_per_session rows).
CHUNK: Final = 100_000
VOCABULARY_SIZE: Final = 1000
PREVIEW_LENGTH: Final = 256  # cortex.models.PREVIEW_LENGTH

# English-like syllables (onset, nucleus, optional coda) for a realistic spread of
# trigrams: the trigram GIN indexes' size and speed depend on it.
_ONSETS: Final = (*"bcdfghjklmnprstvwz", "br", "cr", "dr", "fr", "gr", "pr", "tr", "bl", "cl", "fl")
_ONSETS_2: Final = ("gl", "pl", "sl", "st", "sp", "sk", "sh", "ch", "th", "wh", "")
_NUCLEI: Final = (*"aeiou", "ai", "ea", "ou", "io", "ee")
_CODAS: Final = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "rk")
# Never inside a generated word: the search measurements count on these being rare.
_RESERVED: Final = ("invoice", "zanzibar", "off")
_MASK53: Final = (1 << 53) - 1
# What ``metadata=True`` gives a session (values drawn per row; see the module docstring).
METADATA_SHAPE: Final = (
    '{"channel":"web","priority":1,"customer":{"tier":"gold","region":"eu-west"},'
    '"tags":["refund","vip"],"source":"import"}'
)


def vocabulary(size: int = VOCABULARY_SIZE, *, seed: int = 20260901) -> list[str]:
    """Distinct pseudo-words of 1-3 syllables, deterministic for a seed.

    Words containing ``invoice``, ``zanzibar`` or ``off`` are skipped, so only
    the injected phrases match those search terms.
    """
    rng = random.Random(seed)
    onsets = (*_ONSETS, *_ONSETS_2)
    words: dict[str, None] = {}
    while len(words) < size:
        word = "".join(
            rng.choice(onsets) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
            for _ in range(rng.randint(1, 3))
        )
        if len(word) >= 3 and not any(term in word for term in _RESERVED):
            words[word] = None
    return list(words)


def _rand(seed: int, key: str) -> str:
    """SQL: a uniform float8 in [0, 1) that depends only on ``key`` (a bigint) and ``seed``."""
    return (
        f"((((hashint8extended({key}, {seed}) >> 11) & {_MASK53}))::float8 / {_MASK53 + 1}::float8)"
    )


def _word(seed: int, key: str, vocab_size: int) -> str:
    """SQL: one word of $1 (the vocabulary); word k has probability ~ 1/k (Zipf, s = 1).

    ``floor(exp(u * ln(V + 1)))`` is log-uniform on 1..V: P(index <= k) = ln(k + 1) / ln(V + 1).
    """
    return (
        f"($1::text[])[least({vocab_size}, "
        f"floor(exp({_rand(seed, key)} * ln({vocab_size + 1})))::int)]"
    )


def _words(
    first_seed: int, key: str, vocab_size: int, least: int, most: int, count_seed: int
) -> list[str]:
    """SQL terms for ``least..most`` words; the optional ones are NULL when not drawn."""
    count = f"({least} + floor({_rand(count_seed, key)} * {most - least + 1})::int)"
    terms = []
    for i in range(most):
        word = _word(first_seed + i, key, vocab_size)
        terms.append(word if i < least else f"CASE WHEN {count} > {i} THEN {word} END")
    return terms


def _uuid7(ts: str, key: str) -> str:
    """SQL: a UUIDv7 with ``ts``'s millisecond timestamp and md5(``key``) as the random bits."""
    raw = (
        f"overlay(decode(md5({key}), 'hex') PLACING "
        f"substring(int8send(floor(extract(epoch FROM {ts}) * 1000)::bigint) FROM 3) FROM 1 FOR 6)"
    )
    # set_bit counts from the least significant bit of each byte: bits 52-55 are
    # byte 6's high nibble (version 0111), bits 70-71 byte 8's top bits (variant 10).
    for bit, value in ((52, 1), (53, 1), (54, 1), (55, 0), (70, 0), (71, 1)):
        raw = f"set_bit({raw}, {bit}, {value})"
    return f"encode({raw}, 'hex')::uuid"


def _session_rows(vocab_size: int, tenant: str | None = None) -> str:
    """SQL: the sessions numbered $2..$3 (vocabulary $1, anchor $4), one row each.

    ``tenant``: every session in this one tenant instead of the 100 ``orgN``.
    """
    n = "g.n"
    tenant_sql = (
        f"'org' || CASE WHEN {_rand(1, n)} < 0.2 THEN 0 "
        f"ELSE 1 + least(98, floor(({_rand(1, n)} - 0.2) / 0.8 * 99)::int) END"
        if tenant is None
        else f"'{tenant}'::text"
    )
    depth = f"CASE WHEN {_rand(4, n)} < 0.02 THEN 1 WHEN {_rand(4, n)} < 0.10 THEN 2 ELSE 3 END"
    updated = f"$4::timestamptz - {_rand(5, n)} * interval '90 days'"
    title = _words(100, n, vocab_size, 3, 4, 10)
    body = _words(200, n, vocab_size, 10, 16, 20)
    invoice = f"CASE WHEN {_rand(30, n)} < 0.01 THEN 'invoice 50%_off' END"
    zanzibar = f"CASE WHEN {_rand(31, n)} < 0.0001 THEN 'zanzibar' END"
    last = [*body[:5], invoice, zanzibar, *body[5:]]
    return f"""
        SELECT s0.n, s0.tenant_id, s0.agent_id,
               CASE s0.scope_depth
                   WHEN 1 THEN s0.tenant_id
                   WHEN 2 THEN s0.tenant_id || '/' || s0.project
                   ELSE s0.tenant_id || '/' || s0.project || '/' || s0.usr
               END AS scope,
               s0.scope_depth,
               CASE WHEN s0.scope_depth >= 2 THEN s0.tenant_id || '/' || s0.project END AS scope_l2,
               CASE WHEN s0.scope_depth >= 3
                    THEN s0.tenant_id || '/' || s0.project || '/' || s0.usr END AS scope_l3,
               {_uuid7("s0.created_at", "'ses:' || s0.n")} AS id,
               s0.title, s0.last_message, s0.created_at, s0.updated_at
        FROM (
            SELECT {n} AS n,
                   {tenant_sql} AS tenant_id,
                   'proj' || floor({_rand(2, n)} * 20)::int AS project,
                   'user' || floor({_rand(3, n)} * 50)::int AS usr,
                   ({depth})::smallint AS scope_depth,
                   'agent-' || ({n} % 5) AS agent_id,
                   {updated} AS updated_at,
                   {updated} - {_rand(6, n)} * interval '7 days' AS created_at,
                   concat_ws(' ', {", ".join(title)}) AS title,
                   left(concat_ws(' ', {", ".join(last)}), {PREVIEW_LENGTH}) AS last_message
            FROM generate_series($2::bigint, $3::bigint) AS g(n)
        ) AS s0
    """


def _metadata_json(n: str) -> str:
    """SQL: the compact JSON text of session ``n``'s metadata (:data:`METADATA_SHAPE`)."""
    channel = (
        f"CASE WHEN {_rand(40, n)} < 0.01 THEN 'web' "
        f"ELSE (ARRAY['email', 'chat', 'phone', 'api'])[1 + floor({_rand(41, n)} * 4)::int] END"
    )
    tier = f"(ARRAY['gold', 'silver', 'bronze'])[1 + floor({_rand(43, n)} * 3)::int]"
    region = f"(ARRAY['eu-west', 'us-east', 'ap-south'])[1 + floor({_rand(44, n)} * 3)::int]"
    tag = f"(ARRAY['refund', 'billing', 'login', 'bug', 'vip'])[1 + floor({_rand(45, n)} * 5)::int]"
    return (
        f"""('{{"channel":"' || {channel} || '","priority":' || floor({_rand(42, n)} * 3)::int"""
        f"""  || ',"customer":{{"tier":"' || {tier} || '","region":"' || {region}"""
        f"""  || '"}},"tags":["' || {tag} || '"],"source":"import"}}')::json"""
    )


def _insert_sessions(vocab_size: int, tenant: str | None = None, metadata: bool = False) -> str:
    """SQL: insert sessions $2..$3 with $5 messages each (counts and previews)."""
    return f"""
        INSERT INTO sessions (
            tenant_id, id, agent_id, scope, scope_depth, scope_l2, scope_l3, title, is_default,
            message_count, last_message, created_at, updated_at, metadata_json
        )
        SELECT s.tenant_id, s.id, s.agent_id, s.scope, s.scope_depth, s.scope_l2, s.scope_l3,
               s.title,
               -- The oldest row of ~30 % of the (tenant, agent, scope) triples, unless an
               -- earlier chunk already made that triple's default.
               row_number() OVER (PARTITION BY s.tenant_id, s.agent_id, s.scope ORDER BY s.n) = 1
                   AND (hashtextextended(s.agent_id || ' ' || s.scope, 30) & 1023) < 307
                   AND NOT EXISTS (
                       SELECT 1 FROM sessions AS d
                       WHERE d.tenant_id = s.tenant_id COLLATE "C"
                         AND d.agent_id = s.agent_id COLLATE "C"
                         AND d.scope = s.scope COLLATE "C"
                         AND d.is_default
                   ),
               $5::int,
               CASE WHEN $5::int > 0 THEN s.last_message ELSE '' END,
               s.created_at, s.updated_at,
               {_metadata_json("s.n") if metadata else "NULL::json"}
        FROM ({_session_rows(vocab_size, tenant)}) AS s
    """


def _insert_messages(vocab_size: int, tenant: str | None = None) -> str:
    """SQL: insert the $5 messages of each of sessions $2..$3."""
    key = "(s.n * 4096 + k.seq)"
    short = _words(300, key, vocab_size, 4, 6, 40)
    at = (
        "CASE WHEN k.seq = $5::int THEN s.updated_at "
        "ELSE s.created_at + (s.updated_at - s.created_at) * (k.seq::float8 / $5::int) END"
    )
    return f"""
        INSERT INTO messages (tenant_id, id, session_id, seq, role, content, created_at)
        SELECT s.tenant_id,
               {_uuid7("t.at", "'msg:' || s.n || ':' || k.seq")},
               s.id, k.seq,
               CASE WHEN k.seq % 2 = 1 THEN 'user' ELSE 'assistant' END,
               CASE WHEN k.seq = $5::int THEN s.last_message
                    ELSE concat_ws(' ', {", ".join(short)}) END,
               t.at
        FROM ({_session_rows(vocab_size, tenant)}) AS s
        CROSS JOIN generate_series(1, $5::int) AS k(seq)
        CROSS JOIN LATERAL (SELECT {at} AS at) AS t
    """


async def _preflight(conn: asyncpg.Connection) -> None:
    privileged = await conn.fetchval(
        "SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
    )
    if not privileged:
        raise SystemExit(
            "seed: connect as a superuser (or a BYPASSRLS role): sessions and messages "
            "FORCE row-level security"
        )
    if await conn.fetchval(
        "SELECT to_regclass('sessions') IS NULL OR to_regclass('messages') IS NULL"
    ):
        raise SystemExit("seed: no cortex schema here; run `cortex db upgrade` first")
    if await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM sessions) OR EXISTS (SELECT 1 FROM messages)"
    ):
        raise SystemExit("seed: sessions or messages is not empty; seed a fresh database")


async def seed(
    url: str,
    *,
    sessions: int = 1_000_000,
    messages_per_session: int = 2,
    progress: bool = True,
    chunk: int = CHUNK,
    tenant: str | None = None,
    metadata: bool = False,
) -> None:
    """Fill the migrated, empty database at ``url`` with ``sessions`` sessions and their messages.

    ``url`` must log in as a superuser (or BYPASSRLS role). Deterministic: the
    same arguments give the same rows. ``tenant`` (lowercase letters and
    digits): every session in that one tenant, e.g. to walk them all in one
    ``iter_sessions``; by default they spread over ``org0 .. org99``.
    ``metadata``: give every session metadata (see the module docstring).
    """
    if sessions < 0 or not 0 <= messages_per_session < 4096 or chunk < 1:
        raise ValueError("sessions >= 0, 0 <= messages_per_session < 4096 and chunk >= 1")
    if tenant is not None and not re.fullmatch(r"[a-z0-9]{1,32}", tenant):
        raise ValueError("tenant: 1-32 lowercase letters and digits")
    console = Console(stderr=True)
    words = vocabulary()
    session_sql = _insert_sessions(len(words), tenant, metadata)
    message_sql = _insert_messages(len(words), tenant)
    timings: list[tuple[str, int, float]] = []
    conn = await asyncpg.connect(driver_dsn(url))
    try:
        await _preflight(conn)
        # Session settings only: faster commits (a crash loses the seed, not the
        # database), room for the window sort and the GIN pending lists, UTC so
        # the interval arithmetic never crosses a DST change.
        await conn.execute(
            "SET synchronous_commit = off; SET work_mem = '256MB'; "
            "SET maintenance_work_mem = '1GB'; SET TimeZone = 'UTC'"
        )
        ranges = [(lo, min(lo + chunk - 1, sessions)) for lo in range(1, sessions + 1, chunk)]
        with Progress(
            TextColumn("[bold]{task.description:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=not progress,
        ) as bar:
            task = bar.add_task("sessions", total=sessions)
            started = time.perf_counter()
            for lo, hi in ranges:
                await conn.execute(session_sql, words, lo, hi, ANCHOR, messages_per_session)
                bar.advance(task, hi - lo + 1)
            timings.append(("sessions", sessions, time.perf_counter() - started))

            total = sessions * messages_per_session
            task = bar.add_task("messages", total=total)
            started = time.perf_counter()
            if total:
                # Superuser only: skip the per-row FK triggers (consistent by construction).
                await conn.execute("SET session_replication_role = replica")
                for lo, hi in ranges:
                    await conn.execute(message_sql, words, lo, hi, ANCHOR, messages_per_session)
                    bar.advance(task, (hi - lo + 1) * messages_per_session)
                await conn.execute("RESET session_replication_role")
            timings.append(("messages", total, time.perf_counter() - started))

            task = bar.add_task("vacuum", total=2)
            started = time.perf_counter()
            for table in ("sessions", "messages"):
                await conn.execute(f"VACUUM (ANALYZE) {table}")
                bar.advance(task, 1)
            timings.append(("vacuum", 0, time.perf_counter() - started))
        defaults = await conn.fetchval("SELECT count(*) FROM sessions WHERE is_default")
    finally:
        await conn.close()
    for label, rows, seconds in timings:
        rate = f"  ({rows / seconds:,.0f} rows/s)" if rows and seconds else ""
        console.print(f"{label:<9} {rows:>12,} rows  {seconds:8.1f} s{rate}")
    console.print(f"{'total':<9} {'':>12}       {sum(t for _, _, t in timings):8.1f} s")
    console.print(f"defaults  {defaults:>12,} sessions")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.seed",
        description="Fill a migrated, empty cortex database with deterministic benchmark data.",
    )
    parser.add_argument("--dsn", required=True, help="superuser URL of the migrated database")
    parser.add_argument("--sessions", type=int, default=1_000_000)
    parser.add_argument("--messages-per-session", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=CHUNK, help="sessions per statement")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    asyncio.run(
        seed(
            args.dsn,
            sessions=args.sessions,
            messages_per_session=args.messages_per_session,
            progress=not args.no_progress,
            chunk=args.chunk,
        )
    )


if __name__ == "__main__":
    main()
