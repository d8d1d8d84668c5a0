"""cortex's HTTP API (the ``server`` extra): :func:`create_app` and what ``cortex serve`` runs.

Needs ``pip install 'cortex-sessions[server]'`` (FastAPI, uvicorn, PyJWT).
Every ``/v1`` request carries a bearer token naming its scope; see
docs/server.md.
"""

from cortex.server.app import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_IMPORT_BYTES, create_app
from cortex.server.auth import KEY_ENV, Principal, SigningKey, issue_token

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_IMPORT_BYTES",
    "KEY_ENV",
    "Principal",
    "SigningKey",
    "create_app",
    "issue_token",
]
