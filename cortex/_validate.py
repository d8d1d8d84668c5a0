"""The validation boundary: pydantic's errors become InvalidInput here, and nowhere else.

Every public :class:`cortex.Store` method is wrapped by :func:`boundary`,
which validates its arguments against their annotated types (the Annotated
types of :mod:`cortex.models`) before the body runs; the contract models
translate with :func:`invalid_input` too. A refusal is one
:class:`~cortex.errors.InvalidInput` naming the parameter or field, never a
``TypeError`` or pydantic's ``ValidationError``.

Host-owned JSON is serialised (:func:`encode_json`) to the exact text that is
stored and decoded (:func:`decode_json`) on the way out. This module must not
import the database layer or the models.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
from collections.abc import Callable, Coroutine, Sequence
from contextvars import ContextVar
from typing import Any, Final, ParamSpec, TypeVar, cast

import orjson
from pydantic import ConfigDict, ValidationError, validate_call

from cortex.errors import InvalidInput

__all__ = [
    "boundary",
    "decode_json",
    "encode_json",
    "encoded_again",
    "instance_of",
    "invalid_input",
]

P = ParamSpec("P")
R = TypeVar("R")


def invalid_input(exc: ValidationError, names: Sequence[str] = ()) -> InvalidInput:
    """Turn pydantic's error into one readable InvalidInput line naming each field.

    ``names`` are a function's parameter names: validate_call reports a
    positional argument by its index, and the caller should read its name.
    """
    parts = []
    for error in exc.errors(include_url=False):
        loc = list(error["loc"])
        if loc and isinstance(loc[0], int) and loc[0] < len(names):
            loc[0] = names[loc[0]]
        cause = (error.get("ctx") or {}).get("error")
        if isinstance(cause, InvalidInput) and not loc:
            # A model's own __init__ refused (pydantic calls it from model_validate).
            parts.append(str(cause))
            continue
        where = ".".join(str(p) for p in loc) or exc.title
        message = str(cause) if isinstance(cause, Exception) else error["msg"]
        # Validators that name their field already: keep the full path once.
        field = str(loc[-1]) if loc else ""
        message = message.removeprefix(f"{field}: ")
        parts.append(f"{where}: {message}")
    return InvalidInput("; ".join(parts))


# Store arguments are checked against their annotations: strict where an
# annotation says Strict (no "5" for an int, no 1 for a string), and model
# instances re-validated (see cortex.models._Model: revalidate_instances).
_CALL_CONFIG: Final = ConfigDict(arbitrary_types_allowed=True)

# The JSON texts :func:`encode_json` made of lists and objects during the
# current boundary call, with their UTF-8 sizes, by object (each kept alive here, so its id is not
# reused). The store serialises some of the same values for storage right
# after the boundary checked them, before it awaits anything
# (cortex._calls.messages.encode_batch), and takes the text from here
# (:func:`encoded_again`) rather than encode a large payload twice. No other
# task can change a value in between; the caller's own code could (a custom
# Sequence of messages, a dict subclass that changes the payload while it
# is read), and then the text stored is the one checked a moment before.
_ENCODED: ContextVar[dict[int, tuple[Any, str, int]] | None] = ContextVar(
    "cortex_encoded", default=None
)


def boundary(func: Callable[P, R]) -> Callable[P, R]:
    """Validate a coroutine or async-generator function's arguments before it runs.

    Raises:
        InvalidInput: an argument does not match its annotated type.
    """
    validated = validate_call(config=_CALL_CONFIG)(func)
    names = list(inspect.signature(func).parameters)

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def call(*args: P.args, **kwargs: P.kwargs) -> Any:
            # pydantic validates a coroutine function's arguments when it is
            # awaited; the body's own models already raise InvalidInput, so
            # a ValidationError here can only be the arguments'.
            memo: dict[int, tuple[Any, str, int]] = {}
            token = _ENCODED.set(memo)
            try:
                return await cast(Coroutine[Any, Any, Any], validated(*args, **kwargs))
            except ValidationError as exc:
                raise invalid_input(exc, names) from None
            finally:
                # Emptied, not only unbound: a task started during the call
                # (a connection opening, whose transport lives on in the pool)
                # holds a copy of this context, and with it the memo.
                memo.clear()
                with contextlib.suppress(ValueError):
                    # Closed from outside its task (an abandoned call collected
                    # after its loop closed), the token belongs to another context.
                    _ENCODED.reset(token)

        return cast(Callable[P, R], call)

    @functools.wraps(func)
    def start(*args: P.args, **kwargs: P.kwargs) -> R:
        # An async generator: arguments are checked when it is created, so a
        # bad filter fails at the call, not at the first iteration.
        try:
            return validated(*args, **kwargs)
        except ValidationError as exc:
            raise invalid_input(exc, names) from None

    return start


def instance_of(cls: type, *, none: bool = False) -> Callable[[Any], Any]:
    """A before-validator refusing anything but an instance of ``cls`` (or None, if allowed).

    pydantic would build a model from a dict; a store argument typed as a
    model must be one (it is then validated again all the same).
    """

    def check(value: Any) -> Any:
        if (value is None and none) or isinstance(value, cls):
            return value
        raise ValueError(f"expected a {cls.__name__}, got {type(value).__name__}")

    return check


def encode_json(value: Any, max_bytes: int) -> str:
    r"""The compact JSON text of ``value``, exactly what is stored for it.

    Refused (``ValueError``, which the models and the boundary report as
    InvalidInput naming the field): anything json cannot serialise, NaN and
    infinities, nesting deeper than the encoder allows, a non-string object
    key anywhere (json would turn ``1`` into ``"1"`` and silently merge it
    with a real ``"1"``), NUL characters in keys or strings (PostgreSQL text
    cannot hold them), lone surrogates, and more than ``max_bytes`` UTF-8
    bytes. The text ``\\u0000`` (a backslash, then ``u0000``) is no NUL.
    """
    if type(value) is dict and not value:
        return "{}"  # most metadata: skip the encoder
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON-serialisable ({exc})") from None
    size = len(text) if text.isascii() else len(_utf8(text))
    if size > max_bytes:
        raise ValueError(f"at most {max_bytes} bytes of JSON, got {size}")
    # The walk below decides exactly; this skips it where its answer is known.
    # json.dumps escapes every NUL as \u0000 (so its absence from the text
    # means none in any key or string), and orjson refuses any non-string
    # key (and a few things json.dumps accepts: those take the walk too).
    if "\\u0000" in text or not _string_keys(value):
        _check_keys_and_strings(value)
    encoded = _ENCODED.get()
    if encoded is not None and type(value) in (dict, list):
        encoded[id(value)] = (value, text, size)
    return text


def encoded_again(value: Any, max_bytes: int) -> str:
    """:func:`encode_json` of ``value``, taken from this call's validation where it encoded it.

    Only for values the caller has not let go of since the boundary checked
    them: code that runs before the call's first ``await``.
    """
    encoded = _ENCODED.get()
    found = None if encoded is None else encoded.get(id(value))
    if found is not None and found[0] is value and found[2] <= max_bytes:
        return found[1]
    return encode_json(value, max_bytes)


def _string_keys(value: Any) -> bool:
    """Whether orjson serialises ``value``, which it does only if every object key is a string."""
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise ValueError("not valid Unicode (lone surrogate)") from None


def _check_keys_and_strings(value: Any) -> None:
    # Iterative: json.dumps already bounded the depth, but a recursive walk
    # would need as many Python frames again.
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise ValueError("NUL characters are not allowed")
        elif isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    # ValueError, not TypeError: pydantic reports only ValueError
                    # as a refusal of the field; a TypeError would escape raw.
                    raise ValueError(  # noqa: TRY004
                        f"object keys must be strings, got {type(key).__name__} {key!r:.40}"
                    )
                if "\x00" in key:
                    raise ValueError("NUL characters are not allowed")
                stack.append(inner)
        elif isinstance(item, list | tuple):
            stack.extend(item)


def decode_json(text: str) -> Any:
    """Decode stored JSON text.

    The text came from :func:`encode_json`, which writes each float with
    Python's shortest round-tripping repr and each int in full, so decoding
    gives back exactly the value that was sent: ``1e16`` stays a float,
    ``-0.0`` keeps its sign, ``5e-324`` stays six characters.
    """
    if text == "{}":
        return {}  # most metadata
    if len(text) < _LONG or not has_long_digit_run(text):
        # orjson is the faster decoder and gives exactly what json.loads gives,
        # except for an integer past 64 bits (a float: the scan keeps such text off it).
        return decode_json_of_strings(text)
    return json.loads(text)


def decode_json_of_strings(text: str) -> Any:
    """Decode stored JSON text whose only scalars are strings (a state document's outer object).

    No number to keep exact, so no scan (:func:`has_long_digit_run`): orjson
    decodes it as ``json.loads`` would, and ``json.loads`` decides what
    orjson refuses (a lone surrogate escape, an infinite number, nesting
    past 1024). Property tests hold both readers equal to ``json.loads``.
    """
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


# 19 digits in a row may be an integer outside orjson's exact 64-bit range.
_LONG: Final = 19
# Every ASCII digit to b"1", every other byte to b"0": UTF-8 puts no byte
# below 0x80 inside a multi-byte character, so a run of 19 b"1"s is a run of
# 19 ASCII digits in the text.
_DIGIT_BYTES: Final = bytes(0x31 if 0x30 <= b <= 0x39 else 0x30 for b in range(256))
_DIGIT_RUN: Final = b"1" * _LONG


def has_long_digit_run(text: str) -> bool:
    """Whether ``text`` holds 19 ASCII digits in a row (``[0-9]{19}``).

    Three C passes (encode, translate, find) instead of a regular
    expression, which costs far more on long text: a state document's text
    is checked whole each time it is read (docs/benchmarks.md, 2026-12-01).
    """
    return text.encode("utf-8", "surrogatepass").translate(_DIGIT_BYTES).find(_DIGIT_RUN) != -1
