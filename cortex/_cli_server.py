"""``cortex serve`` (the HTTP API under uvicorn) and ``cortex token issue``.

Both need the ``server`` extra; they import it only when run, so the rest
of the command line works without it. The signing key comes from
``$CORTEX_SIGNING_KEY`` only: a key on the command line would show in the
process list.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cortex._cli_common import EXIT_OK, UsageError, echo
from cortex.errors import InvalidInput

__all__ = ["add_server_commands"]

_KEY_ENV = "CORTEX_SIGNING_KEY"
# The operator console's login (granted cortex_console); default: the server's own.
_CONSOLE_URL_ENV = "CORTEX_CONSOLE_DATABASE_URL"


def _signing_key() -> Any:
    try:
        from cortex.server import SigningKey
    except ImportError:
        raise UsageError(
            "the server extra is not installed: pip install 'cortex-sessions[server]'"
        ) from None
    try:
        return SigningKey.parse(os.environ.get(_KEY_ENV))
    except InvalidInput as exc:
        raise UsageError(str(exc)) from None


@contextmanager
def _url(args: argparse.Namespace) -> Iterator[str]:
    """``--database-url`` or ``$CORTEX_DATABASE_URL``, else the embedded server (left running)."""
    given = getattr(args, "database_url", None) or os.environ.get("CORTEX_DATABASE_URL")
    if given:
        yield given
        return
    from cortex.embedded import database_url

    with database_url(keep=True) as (found, _):
        yield found


def _log_access_to_stderr() -> None:
    """Print the ``cortex.access`` logger's JSON lines, as they are, on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access = logging.getLogger("cortex.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    access.propagate = False


def _demo(args: argparse.Namespace) -> tuple[Any, str, str]:
    """The embedded demo database for the console: a key, its console URL, its application URL."""
    import anyio

    from cortex._console_demo import prepare_console_demo
    from cortex.embedded import database_url

    if not os.environ.get(_KEY_ENV):
        import secrets

        # The demo's own key, for this run only: its tokens die with the process.
        os.environ[_KEY_ENV] = secrets.token_urlsafe(32)
    key = _signing_key()
    with database_url(keep=True) as (found, embedded):
        if not embedded:
            raise UsageError("--demo runs on the embedded server: unset CORTEX_DATABASE_URL")
        console_url, app_url = anyio.run(prepare_console_demo, found)
    from cortex.server import issue_token
    from cortex.server.auth import ALL_TENANTS

    token = issue_token(
        key, scope=ALL_TENANTS, role="operator", ttl=8 * 3600, subject="demo-operator"
    )
    echo(f"cortex console: http://{args.host}:{args.port}/console/")
    echo("sign in with this operator token (every tenant, 8 hours):")
    echo(token)
    return key, console_url, app_url


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the HTTP API until SIGTERM or Ctrl-C; in-flight requests finish first."""
    import uvicorn

    from cortex.server import create_app

    if args.access_log:
        _log_access_to_stderr()
    console_url = os.environ.get(_CONSOLE_URL_ENV) or None
    if args.demo:
        key, console_url, demo_url = _demo(args)
        args.database_url = demo_url
    else:
        key = _signing_key()
    with _url(args) as url:
        app = create_app(
            url,
            signing_key=key,
            cors_origins=args.cors_origin or (),
            max_body_bytes=args.max_body_bytes,
            telemetry=not args.no_metrics,
            access_log=args.access_log,
            console_url=console_url,
            secure_cookies=args.secure_cookies,
        )
        config = uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            timeout_graceful_shutdown=args.graceful_timeout,
            proxy_headers=False,
            server_header=False,
            # cortex's JSON access log (--access-log) replaces uvicorn's plain one.
            access_log=False,
        )
        uvicorn.Server(config).run()
    return EXIT_OK


def cmd_token_issue(args: argparse.Namespace) -> int:
    """Print a token for ``--scope`` signed with the HS256 secret in ``$CORTEX_SIGNING_KEY``."""
    key = _signing_key()
    from cortex.server import issue_token
    from cortex.server.auth import ALL_TENANTS

    if args.all_tenants and args.role != "operator":
        raise UsageError("--all-tenants: for --role operator only")
    scope = ALL_TENANTS if args.all_tenants else args.scope
    echo(issue_token(key, scope=scope, role=args.role, ttl=args.ttl, subject=args.subject))
    return EXIT_OK


def add_server_commands(
    commands: Any, parser_class: type[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``cortex serve`` and ``cortex token issue`` under ``commands``."""
    serve = commands.add_parser(
        "serve",
        help="serve the HTTP API (needs $CORTEX_SIGNING_KEY; the server extra)",
        parents=[common],
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on (8080)")
    serve.add_argument(
        "--cors-origin",
        action="append",
        metavar="ORIGIN",
        help="an origin browsers may call from (repeatable; CORS is off without one)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=1024 * 1024,
        help="largest request body; 413 beyond it (1 MiB; imports: 256 MiB)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish after SIGTERM (30)",
    )
    serve.add_argument(
        "--no-metrics",
        action="store_true",
        help="serve no /metrics and make no spans (telemetry is on by default)",
    )
    serve.add_argument(
        "--access-log",
        action="store_true",
        help="log one JSON line per request on stderr (method, route, status, duration, trace id)",
    )
    serve.add_argument(
        "--secure-cookies",
        action="store_true",
        help="mark the console's cookies Secure (behind a TLS-terminating proxy)",
    )
    serve.add_argument(
        "--demo",
        action="store_true",
        help="on the embedded server with demo data; prints an operator token for /console",
    )
    serve.set_defaults(func=cmd_serve)

    token = commands.add_parser("token", help="tokens for the HTTP API", parents=[common])
    sub = token.add_subparsers(dest="token_command", required=True, parser_class=parser_class)
    issue = sub.add_parser(
        "issue",
        help="print a token signed with $CORTEX_SIGNING_KEY (an HS256 secret)",
        parents=[common],
    )
    where = issue.add_mutually_exclusive_group(required=True)
    where.add_argument("--scope", help="the scope the token acts in")
    where.add_argument(
        "--all-tenants",
        action="store_true",
        help="an operator token for every tenant (the console only; /v1 refuses it)",
    )
    issue.add_argument("--role", choices=("app", "operator"), default="app", help="app or operator")
    issue.add_argument("--ttl", type=int, default=3600, help="seconds until it expires (3600)")
    issue.add_argument("--subject", default="cortex-cli", help="the token's sub claim")
    issue.set_defaults(func=cmd_token_issue)
