"""``cortex sessions …``: the operator's loop (list, show, messages, export, fork, rewind, resume, mark, unmark, abort).

Each command acts in ``--scope``, prints a human view or ``--json``, and
leaves error handling (one line, an exit code) to :func:`cortex.cli.main`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from datetime import datetime
from typing import Any, Final

import anyio
from rich.console import Console
from rich.table import Table

from cortex._cli_common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    console,
    echo,
    emit_json,
    json_text,
    literal,
    say,
    visible,
    when,
    with_store,
)
from cortex._cli_console import add_waiting_command
from cortex.errors import NotFound
from cortex.integrations._payloads import tool_uses
from cortex.models import (
    MAX_MESSAGE_LIMIT,
    ListFilter,
    Message,
    Session,
    SessionDetail,
    SessionState,
)
from cortex.store import Store

__all__ = ["add_session_commands"]


# Message's deprecated first-of-each fields: the lists say the same, once.
_DEPRECATED: Final = {"requested_input", "function_response"}


def _message_json(m: Message) -> dict[str, Any]:
    """A message as the CLI prints it in JSON: every field but the deprecated ones."""
    return m.model_dump(mode="json", exclude=_DEPRECATED)


def _metadata(pairs: list[str] | None) -> dict[str, Any] | None:
    """``--metadata KEY=JSON`` options as one metadata filter (None if none were given)."""
    if not pairs:
        return None
    found: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise UsageError(f"--metadata: {pair!r} is not KEY=JSON")
        if key in found:
            raise UsageError(f"--metadata: key {key!r} given twice")
        try:
            found[key] = json.loads(text)
        except ValueError as exc:
            raise UsageError(
                f"--metadata: {key!r}: not JSON ({exc}); a string is quoted: {key}='\"text\"'"
            ) from None
    return found


def _instant(text: str | None, option: str) -> datetime | None:
    """An ISO 8601 instant with its UTC offset (``Z`` or ``+hh:mm``); None if not given."""
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"{option}: {text!r} is not an ISO 8601 date and time") from None
    if when.utcoffset() is None:
        raise UsageError(f"{option}: {text!r} has no UTC offset (add Z or +hh:mm)")
    return when


def _list_filter(args: argparse.Namespace) -> ListFilter:
    return ListFilter(
        agent_id=args.agent,
        exact=args.exact,
        default_only=args.default_only,
        search=args.search,
        state=SessionState(args.state) if args.state else None,
        metadata=_metadata(args.metadata),
        created_after=_instant(args.created_after, "--created-after"),
        created_before=_instant(args.created_before, "--created-before"),
        updated_after=_instant(args.updated_after, "--updated-after"),
        updated_before=_instant(args.updated_before, "--updated-before"),
        limit=args.limit,
        offset=args.offset,
    )


# How wide a listed session's "why" is drawn at most, escapes included.
_WHY_WIDTH: Final = 48


# Concurrent detail reads of a listing, below the default pool size of five.
_DETAIL_READS = 4


def _short(text: str, width: int = _WHY_WIDTH, *, in_json: bool = False) -> str:
    """``text`` cut to what draws in ``width`` columns once escaped, with "…" if it was cut.

    Cut before escaping, a character at a time, so no escape is cut in half;
    ``in_json``: escaped as JSON is (cortex._cli_common.visible).
    """
    if len(visible(text, in_json=in_json)) <= width:
        return text
    used = 0
    for i, char in enumerate(text):
        used += len(visible(char, in_json=in_json))
        if used > width - 1:
            return text[:i] + "…"
    return text


async def _details(store: Store, found: list[Session]) -> dict[str, SessionDetail]:
    """What each listed session waits on or why it stopped: its detail, for every one not idle."""
    details: dict[str, SessionDetail] = {}
    # A few reads at a time: a page of paused sessions costs round trips, not their sum.
    limit = anyio.Semaphore(_DETAIL_READS)

    async def read(session_id: str) -> None:
        async with limit:
            with contextlib.suppress(NotFound):  # deleted since the page was read
                details[session_id] = await store.inspect_session(session_id)

    async with anyio.create_task_group() as tg:
        for s in found:
            if s.state is not SessionState.IDLE:  # an idle one has nothing pending, no marker
                tg.start_soon(read, s.id)
    return details


def _why(detail: SessionDetail | None) -> str:
    """The cause of the session's state, in a line: its first pending input, or a marker's reason."""
    if detail is None:
        return ""
    if detail.state is SessionState.PAUSED and detail.pending:
        first = detail.pending[0]
        more = len(detail.pending) - 1
        text = first.interrupt_id + (f": {first.message}" if first.message else "")
        return _short(text) + (f" (+{more} more)" if more else "")
    reason = {
        SessionState.ABORTED: detail.abort_reason,
        SessionState.INTERRUPTED: detail.interrupt_reason,
    }.get(detail.state)
    if reason is None:
        return ""
    return _short(reason) if reason else "(no reason given)"


def _listed_json(s: Session, detail: SessionDetail | None) -> dict[str, Any]:
    """A listed session in JSON, with its pending inputs and marker reasons as show names them."""
    out = s.model_dump(mode="json")
    if detail is None:
        out.update(pending=[], abort_reason=None, interrupt_reason=None)
    else:
        extra = detail.model_dump(
            mode="json", include={"pending", "abort_reason", "interrupt_reason"}
        )
        out.update(extra)
    return out


def cmd_list(args: argparse.Namespace) -> int:
    flt = _list_filter(args)

    async def action(store: Store) -> tuple[list[Session], int, dict[str, SessionDetail]]:
        found = await store.list_sessions(flt)
        return found, await store.count_sessions(flt), await _details(store, found)

    found, total, details = with_store(args, action)
    if args.json:
        emit_json(
            {
                "total": total,
                "sessions": [_listed_json(s, details.get(s.id)) for s in found],
            }
        )
        return EXIT_OK
    if not found:
        say(
            console(),
            f"no sessions in {args.scope} match" + (f" ({total} in all)" if total else ""),
        )
        return EXIT_OK
    table = Table(
        title=literal(f"sessions in {args.scope} ({len(found)} of {total})"), title_justify="left"
    )
    table.add_column("id", no_wrap=True)
    for column in ("state", "agent", "scope", "title", "msgs", "last activity", "pending"):
        table.add_column(column, overflow="fold")
    table.add_column("why", overflow="fold")
    for s in found:
        table.add_row(
            literal(s.id),
            literal(s.state.value),
            literal(s.agent_id),
            literal(str(s.scope)),
            literal(s.title or "-"),
            str(s.message_count),
            when(s.updated_at),
            str(s.pending_count) if s.pending_count else "",
            literal(_why(details.get(s.id))),
        )
    console().print(table)
    return EXIT_OK


def _say_json(out: Console, first: str, value: Any, depth: int) -> None:
    """``first`` followed by ``value`` as indented JSON, its later lines ``depth`` spaces in."""
    lines = json_text(value, indent=2).split("\n")
    say(out, first + lines[0])
    for line in lines[1:]:
        say(out, " " * depth + line)


def cmd_show(args: argparse.Namespace) -> int:
    detail = with_store(args, lambda store: store.inspect_session(args.session_id))
    if args.json:
        emit_json(detail.model_dump(mode="json"))
        return EXIT_OK
    out = console()
    s = detail.session
    say(out, f"{s.id}  {detail.state.value}")
    fields: tuple[tuple[str, str], ...] = (
        ("agent", s.agent_id),
        ("key", s.key if s.key is not None else "-"),
        ("scope", str(s.scope)),
        ("title", s.title or "-"),
        ("messages", str(s.message_count)),
        ("last message", s.last_message or "-"),
        ("default", "yes" if s.is_default else "no"),
        ("created", when(s.created_at)),
        ("updated", when(s.updated_at)),
        ("abort reason", detail.abort_reason or "-"),
        ("interrupt reason", detail.interrupt_reason or "-"),
    )
    for label, value in fields:
        say(out, f"  {label:>16}: {value}")
    for label, data in (("metadata", s.metadata), ("state data", s.data)):
        if data:
            _say_json(out, f"  {label:>16}: ", data, 20)
        else:
            say(out, f"  {label:>16}: -")
    if not detail.pending:
        say(out, "  no pending inputs")
    for p in detail.pending:
        say(out)
        say(
            out,
            f"  pending {p.interrupt_id} (asked at seq {p.raised_seq}, {when(p.raised_at)}"
            + (f", by {p.author}" if p.author else "")
            + f"): {p.message or '-'}",
        )
        shown: tuple[tuple[str, Any], ...] = (
            ("response schema", p.response_schema),
            ("payload", p.payload),
        )
        for name, data in shown:
            if data is None:
                continue
            # The JSON on its own lines, indented beneath its label.
            say(out, f"    {name}:")
            _say_json(out, " " * 6, data, 6)
    return EXIT_OK


# How wide a preview of a tool's arguments or answer is drawn at most.
_PREVIEW_WIDTH: Final = 80


def _preview(body: Any) -> str:
    """A tool's arguments or answer, short: text as it is, anything else as JSON (json_text's)."""
    if isinstance(body, str):
        return _short(body, _PREVIEW_WIDTH)
    text = json.dumps(body, ensure_ascii=False, default=str)
    return visible(_short(text, _PREVIEW_WIDTH, in_json=True), in_json=True)


def _tool_names(messages: list[Message]) -> dict[str, str]:
    """The tool each call id of these messages named (an Agents SDK output names none)."""
    return {
        use.call_id: use.name
        for m in messages
        for use in tool_uses(m.payload)
        if use.kind == "call" and use.call_id and use.name
    }


def _describe(m: Message, names: dict[str, str]) -> str:
    """The message's text, then each tool it calls or answers and each question it asks or answers."""
    extra = ""
    answered = set()
    for use in tool_uses(m.payload):
        if use.kind == "call":
            extra += f"  [calls {use.name or use.call_id}: {_preview(use.body)}]"
            continue
        answered.add(use.call_id)
        said = "" if use.body == m.content else f": {_preview(use.body)}"
        extra += f"  [answers {use.name or names.get(use.call_id) or use.call_id}{said}]"
    extra += "".join(
        f"  [asks {q.interrupt_id}: {_short(q.message, _PREVIEW_WIDTH)}]"
        for q in m.requested_inputs
    )
    for a in m.function_responses:
        if a.id not in answered:  # the payload said it with the tool's name
            extra += f"  [answers {a.id}: {_preview(a.response)}]"
    return f"{m.content}{extra}" if m.content else extra.lstrip()


def cmd_messages(args: argparse.Namespace) -> int:
    limit = args.last
    history = with_store(
        args, lambda store: store.get_session_with_messages(args.session_id, limit=limit)
    )
    if args.json:
        emit_json(
            {
                "session_id": history.session.id,
                "message_count": history.session.message_count,
                "messages": [_message_json(m) for m in history.messages],
            }
        )
        return EXIT_OK
    s = history.session
    table = Table(
        title=literal(f"{s.id}: the last {len(history.messages)} of {s.message_count} messages"),
        title_justify="left",
    )
    for column in ("seq", "at", "role", "author", "content"):
        table.add_column(column, overflow="fold")
    names = _tool_names(history.messages)
    for m in history.messages:
        table.add_row(
            str(m.seq),
            when(m.created_at),
            literal(m.role),
            literal(m.author),
            literal(_describe(m, names)),
        )
    console().print(table)
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    async def action(store: Store) -> dict[str, Any]:
        # The newest page and the session come from one snapshot; older pages
        # are read backwards from there, so a concurrent append is never half in.
        session, page = await store.get_session_with_messages(
            args.session_id, limit=MAX_MESSAGE_LIMIT
        )
        messages = list(page)
        while messages and messages[0].seq > 1:
            older = await store.recent_messages(
                args.session_id, limit=MAX_MESSAGE_LIMIT, before_seq=messages[0].seq
            )
            if not older:
                break
            messages = older + messages
        return {
            "session": session.model_dump(mode="json"),
            "messages": [_message_json(m) for m in messages],
        }

    emit_json(with_store(args, action))
    return EXIT_OK


def cmd_fork(args: argparse.Namespace) -> int:
    fork = with_store(
        args,
        lambda store: store.fork_session(
            args.session_id, through_seq=args.through_seq, title=args.title
        ),
    )
    if args.json:
        emit_json(fork.model_dump(mode="json"))
        return EXIT_OK
    source = fork.forked_from
    origin = f"{source.session_id} through seq {source.seq}" if source else args.session_id
    say(
        console(),
        f"forked {origin} into {fork.id} ({fork.scope}): {fork.message_count} messages"
        + (f", {fork.pending_count} pending" if fork.pending_count else ""),
    )
    return EXIT_OK


def _confirmed(question: str) -> bool:
    """Ask ``question`` on stderr and read yes or no from stdin; no input at all is no."""
    sys.stderr.write(visible(question) + " [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline()
    if not answer.endswith("\n"):
        sys.stderr.write("\n")  # end of input: the prompt's line is ended here
    return answer.strip().lower() in ("y", "yes")


def cmd_rewind(args: argparse.Namespace) -> int:
    # A negative seq is the store's to refuse, before anything is asked.
    if not args.yes and args.to_seq >= 0:
        session = with_store(args, lambda store: store.get_session(args.session_id))
        removed = session.message_count - args.to_seq
        if removed > 0:
            first = args.to_seq + 1
            span = (
                f"message {first}" if removed == 1 else f"messages {first}-{session.message_count}"
            )
            question = (
                f"rewind {session.id} to seq {args.to_seq}: delete {span}"
                f" ({removed} of {session.message_count})?"
            )
            if not _confirmed(question):
                echo(
                    "cortex: rewind declined; nothing was deleted (--yes skips the question)",
                    err=True,
                )
                return EXIT_ERROR
    rewound = with_store(
        args, lambda store: store.rewind_session(args.session_id, to_seq=args.to_seq)
    )
    if args.json:
        emit_json(rewound.model_dump(mode="json"))
    else:
        say(
            console(),
            f"rewound {rewound.id} to seq {args.to_seq}: {rewound.message_count} messages, "
            f"{rewound.state.value}"
            + (f", {rewound.pending_count} pending" if rewound.pending_count else ""),
        )
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    try:
        response = json.loads(args.response)
    except ValueError as exc:
        raise UsageError(f"--response: not JSON ({exc})") from None

    async def action(store: Store) -> Message:
        try:
            return await store.resume(
                args.session_id, args.interrupt, response, author=args.author or ""
            )
        except NotFound:
            # Name what is pending, if the session is there at all (else its own NotFound).
            detail = await store.inspect_session(args.session_id)
            asked = ", ".join(p.interrupt_id for p in detail.pending) or "none"
            raise NotFound(
                f"no pending input {args.interrupt!r} in {args.session_id}; pending: {asked}"
            ) from None

    stored = with_store(args, action)
    if args.json:
        emit_json(_message_json(stored))
    else:
        say(
            console(), f"resumed {stored.session_id}: answered {args.interrupt} at seq {stored.seq}"
        )
    return EXIT_OK


def _state_after(args: argparse.Namespace, session: Session | None, absent: str) -> int:
    """The session as a marker left it, as abort prints it; ``absent`` when there is none yet."""
    if args.json:
        emit_json(
            session.model_dump(mode="json")
            if session is not None
            else {"id": args.session_id, "state": None, "note": absent}
        )
    else:
        say(console(), f"{args.session_id}: {session.state.value if session else absent}")
    return EXIT_OK


async def _session_or_none(store: Store, session_id: str) -> Session | None:
    try:
        return await store.get_session(session_id)
    except NotFound:
        return None


def cmd_mark(args: argparse.Namespace) -> int:
    async def action(store: Store) -> Session | None:
        await store.mark_interrupted(args.session_id, args.reason)
        return await _session_or_none(store, args.session_id)

    # The session need not exist yet: the marker waits for it.
    found = with_store(args, action)
    return _state_after(args, found, "marked (no such session yet: the marker waits for it)")


def cmd_unmark(args: argparse.Namespace) -> int:
    async def action(store: Store) -> Session | None:
        await store.clear_interrupted(args.session_id)
        return await _session_or_none(store, args.session_id)

    return _state_after(args, with_store(args, action), "unmarked (no such session)")


def cmd_clear(args: argparse.Namespace) -> int:
    # The old name of unmark: "clear" also reads as Store.clear_messages, which removes a transcript.
    echo(
        "cortex: note: `cortex sessions clear` is deprecated; it is `cortex sessions unmark`"
        " (it removes the interrupt marker, not the messages)",
        err=True,
    )
    return cmd_unmark(args)


def cmd_abort(args: argparse.Namespace) -> int:
    session = with_store(args, lambda store: store.abort_session(args.session_id, args.reason))
    if args.json:
        emit_json(session.model_dump(mode="json"))
    else:
        say(console(), f"aborted {session.id} ({session.scope}): {args.reason}")
    return EXIT_OK


def add_session_commands(
    commands: Any, parser_class: type[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``cortex sessions …`` under ``commands``; ``common`` holds the global options."""
    sessions = commands.add_parser(
        "sessions",
        help="operators: find, read, fork, rewind, answer, mark and abort sessions",
        parents=[common],
    )
    sub = sessions.add_subparsers(dest="sessions_command", required=True, parser_class=parser_class)
    shown: list[str] = []

    def command(
        name: str, summary: str | None, func: Any, *, session: bool = True, hidden: bool = False
    ) -> Any:
        # argparse lists a subcommand in the help only when it is given a help text.
        p = sub.add_parser(name, parents=[common], **({} if hidden else {"help": summary}))
        if not hidden:
            shown.append(name)
        if session:
            p.add_argument("session_id", help="the session, a ses_… id")
        p.add_argument(
            "--scope", required=True, help="the tenant path to act in, e.g. acme/support"
        )
        p.add_argument("--json", action="store_true", help="print JSON")
        p.set_defaults(func=func)
        return p

    listing = command("list", "sessions visible from a scope", cmd_list, session=False)
    listing.add_argument("--agent", help="only this agent's sessions")
    listing.add_argument("--exact", action="store_true", help="only sessions at exactly --scope")
    listing.add_argument("--default-only", action="store_true", help="only default sessions")
    listing.add_argument(
        "--search", help="case-insensitive substring of the title or the last message's preview"
    )
    listing.add_argument(
        "--state", choices=[s.value for s in SessionState], help="only sessions in this state"
    )
    listing.add_argument(
        "--metadata",
        action="append",
        metavar="KEY=JSON",
        help="only sessions whose metadata holds KEY with exactly this JSON value (repeatable)",
    )
    for edge, what in (
        ("created-after", "created after"),
        ("created-before", "created before"),
        ("updated-after", "last active after"),
        ("updated-before", "last active before"),
    ):
        listing.add_argument(
            f"--{edge}",
            metavar="WHEN",
            help=f"only sessions {what} this instant (ISO 8601 with a UTC offset, exclusive)",
        )
    listing.add_argument("--limit", type=int, default=0, help="1-1000 (default 50)")
    listing.add_argument("--offset", type=int, default=0, help="skip this many sessions first")
    command("show", "one session: metadata, state, pending inputs with their schemas", cmd_show)
    messages = command("messages", "a session's newest messages, oldest first", cmd_messages)
    messages.add_argument(
        "--last", type=int, default=20, help=f"how many (1-{MAX_MESSAGE_LIMIT}, default 20)"
    )
    command("export", "the whole transcript as JSON (session and every message)", cmd_export)
    fork = command(
        "fork",
        "a new session holding a copy of a session's messages (all, or up to a seq)",
        cmd_fork,
    )
    fork.add_argument(
        "--through-seq", type=int, help="copy messages 1 to this seq (default: all; 0: none)"
    )
    fork.add_argument("--title", help="the fork's title (default: the source's)")
    rewind = command("rewind", "delete a session's messages after a seq (asks first)", cmd_rewind)
    rewind.add_argument(
        "--to-seq", type=int, required=True, help="keep messages 1 to this seq (0: none)"
    )
    rewind.add_argument("--yes", action="store_true", help="delete without asking")
    resume = command("resume", "answer a pending input", cmd_resume)
    resume.add_argument("--interrupt", required=True, help="the interrupt id asked")
    resume.add_argument("--response", required=True, help="the answer, as JSON")
    resume.add_argument("--author", help="who answers (e.g. ops@acme)")
    mark = command("mark", "mark a session interrupted (e.g. drained for a deploy)", cmd_mark)
    mark.add_argument("--reason", required=True, help="why, shown to whoever resumes it")
    command("unmark", "remove a session's interrupt marker (the messages stay)", cmd_unmark)
    abort = command("abort", "write a durable abort marker", cmd_abort)
    abort.add_argument("--reason", required=True, help="why, kept with the marker")
    # unmark's former name, kept working; left out of the help.
    old = command("clear", None, cmd_clear, hidden=True)
    old.description = "deprecated: the old name of `cortex sessions unmark`"
    add_waiting_command(sub, common)
    shown.append("waiting")
    sub.metavar = "{" + ",".join(shown) + "}"
