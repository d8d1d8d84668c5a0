"""Unique-id factories, so tests never collide (cosmicpython's random_refs habit)."""

from __future__ import annotations

import uuid


def suffix() -> str:
    return uuid.uuid4().hex[:8]


def agent(name: str = "agent") -> str:
    return f"{name}-{suffix()}"
