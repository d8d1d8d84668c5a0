"""``cortex scope …``: erase, export and import a scope's data.

Each command acts in the scope it names (PATH; for ``import``, ``--into`` or
the export's root), prints a human view or ``--json``, shows progress on
stderr for long work, and leaves error handling (one line, an exit code)
to :func:`cortex.cli.main`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any, Final, TypeVar

import anyio

from cortex._cli_common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    database_url,
    echo,
    emit_json,
    when,
)
from cortex._revision_helpers.progress_v1 import progress
from cortex.errors import InvalidInput
from cortex.models import ErasureReport
from cortex.scope import Scope, use_scope
from cortex.store import Store, connect

__all__ = ["add_scope_commands"]

_T = TypeVar("_T")

# What an erasure removes, in the order a report names it.
_COUNTED: Final = ("sessions", "messages", "pending_inputs", "markers", "scope_documents")


async def _bound(
    args: argparse.Namespace, path: str, action: Callable[[Store], Awaitable[_T]]
) -> _T:
    """Run ``action`` on a store bound to ``path``, in the running event loop."""
    url = database_url(args)
    scope = Scope.parse(path)
    async with connect(url, pool_size=1, max_overflow=0) as store:
        with use_scope(scope):
            return await action(store)


def _in_scope(args: argparse.Namespace, path: str, action: Callable[[Store], Awaitable[_T]]) -> _T:
    """Run ``action`` on a store bound to ``path``."""
    return anyio.run(_bound, args, path, action)


def _counts(report: ErasureReport) -> str:
    return ", ".join(f"{getattr(report, name):,} {name.replace('_', ' ')}" for name in _COUNTED)


def _confirmed(question: str) -> bool:
    """Ask on stderr; only ``y`` or ``yes`` agrees (end of input declines)."""
    print(question, end=" ", file=sys.stderr, flush=True)
    try:
        answer = input()
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_erase(args: argparse.Namespace) -> int:
    path = args.path

    async def count(store: Store) -> ErasureReport:
        return await store.erase_scope(dry_run=True)

    planned = _in_scope(args, path, count)
    if args.dry_run:
        if args.json:
            emit_json(planned.model_dump(mode="json"))
        else:
            echo(f"would erase from {path}: {_counts(planned)}")
        return EXIT_OK
    if not args.yes and not _confirmed(
        f"erase everything at and beneath {path} ({_counts(planned)})? [y/N]"
    ):
        echo("nothing erased", err=True)
        return EXIT_ERROR

    async def erase(store: Store) -> ErasureReport:
        with progress(f"erasing {path}", planned.sessions, unit="sessions") as advance:
            done = 0

            def on_batch(report: ErasureReport) -> None:
                nonlocal done
                advance(report.sessions - done)
                done = report.sessions

            return await store.erase_scope(on_batch=on_batch)

    report = _in_scope(args, path, erase)
    if args.json:
        emit_json(report.model_dump(mode="json"))
        return EXIT_OK
    echo(f"erased from {path}: {_counts(report)}")
    if report.receipt is not None:
        receipt = report.receipt
        echo(
            f"receipt {receipt.id}: began {when(receipt.at)}"
            + (f", finished {when(receipt.finished_at)}" if receipt.finished_at else "")
        )
    return EXIT_OK


def _dump(record: dict[str, Any]) -> str:
    # ASCII only: a line never carries a raw control or separator character.
    return json.dumps(record, separators=(",", ":"))


def cmd_export(args: argparse.Namespace) -> int:
    path = args.path

    async def export(out: IO[str]) -> dict[str, Any]:
        async def walk(store: Store) -> dict[str, Any]:
            records = store.export_scope()
            header = await anext(records)
            out.write(_dump(header) + "\n")
            end: dict[str, Any] = {}
            with progress(f"exporting {path}", header["messages"], unit="messages") as advance:
                async for record in records:
                    out.write(_dump(record) + "\n")
                    if record["type"] == "message":
                        advance(1)
                    elif record["type"] == "end":
                        end = record
            out.flush()
            return end

        return await _bound(args, path, walk)

    with ExitStack() as stack:
        out = (
            stack.enter_context(Path(args.output).open("w", encoding="utf-8"))
            if args.output
            else sys.stdout
        )
        end = anyio.run(export, out)
    if args.output:
        counts = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in end.items() if k != "type")
        echo(f"exported {path} to {args.output}: {counts}", err=True)
    return EXIT_OK


def _lines(source: IO[str]) -> Iterator[Any]:
    for number, line in enumerate(source, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError:
            raise InvalidInput(f"line {number}: not a JSON record") from None


def cmd_import(args: argparse.Namespace) -> int:
    try:
        source = Path(args.file).open(encoding="utf-8")  # noqa: SIM115  # closed below
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror or exc}") from None
    with source:
        records = _lines(source)
        first = next(records, None)
        if first is None:
            raise InvalidInput(f"{args.file}: empty; an export starts with its header")
        header = first if isinstance(first, dict) else {}
        root = header.get("root")
        path = args.into or (root if isinstance(root, str) else None)
        if path is None:
            raise InvalidInput(f"{args.file}: the first record is not an export's header")
        # About one record a session and one a message (pending inputs and markers are few).
        total = sum(n for n in (header.get("sessions"), header.get("messages")) if type(n) is int)

        def stream() -> Iterator[Any]:
            yield first
            yield from records

        async def restore(store: Store) -> Any:
            with progress(f"importing into {path}", total, unit="records") as advance:
                return await store.import_scope(stream(), into=args.into, on_records=advance)

        report = _in_scope(args, path, restore)
    if args.json:
        emit_json(report.model_dump(mode="json"))
        return EXIT_OK
    written = ", ".join(f"{getattr(report, name):,} {name.replace('_', ' ')}" for name in _COUNTED)
    echo(f"imported into {report.scope}: {written}; {report.unchanged:,} rows already there")
    return EXIT_OK


def add_scope_commands(
    commands: Any, parser_class: type[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``cortex scope …`` under ``commands``; ``common`` holds the global options."""
    scope = commands.add_parser(
        "scope", help="erase, export and import everything at and beneath a scope", parents=[common]
    )
    sub = scope.add_subparsers(dest="scope_command", required=True, parser_class=parser_class)

    erase = sub.add_parser(
        "erase", help="erase everything at and beneath PATH, with a receipt", parents=[common]
    )
    erase.add_argument("path", help="the scope to erase, e.g. acme/eu/user-42")
    erase.add_argument("--dry-run", action="store_true", help="count what would go; erase nothing")
    erase.add_argument("--yes", action="store_true", help="do not ask before erasing")
    erase.add_argument("--json", action="store_true", help="print JSON")
    erase.set_defaults(func=cmd_erase)

    export = sub.add_parser(
        "export", help="everything at and beneath PATH as JSON Lines records", parents=[common]
    )
    export.add_argument("path", help="the scope to export, e.g. acme/eu/user-42")
    export.add_argument("-o", "--output", help="write to this file (default: stdout)")
    export.set_defaults(func=cmd_export)

    restore = sub.add_parser(
        "import", help="restore an export (JSON Lines), exactly as it was", parents=[common]
    )
    restore.add_argument("file", help="a file `cortex scope export` wrote")
    restore.add_argument(
        "--into", help="the scope the export's root becomes (default: the root itself)"
    )
    restore.add_argument("--json", action="store_true", help="print JSON")
    restore.set_defaults(func=cmd_import)
