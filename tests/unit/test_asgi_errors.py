from __future__ import annotations

import pytest

import cortex
from cortex.asgi import error_body, status_for


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (cortex.NotFound("x"), 404),
        (cortex.InvalidInput("x"), 422),
        (cortex.InvalidScope("x"), 422),
        (cortex.ScopeViolation("x"), 403),
        (cortex.ScopeMissing("x"), 500),
        (cortex.Conflict("x"), 409),
        (cortex.AlreadyAborted("x"), 409),
        (cortex.SessionAborted("x"), 409),
        (cortex.SchemaMismatch("x"), 503),
        (cortex.DatabaseUnavailable("x"), 503),
        (cortex.OperationTimeout("x"), 504),
        (cortex.DatabaseError("x"), 500),
        (cortex.CortexError("x"), 500),
    ],
)
def test_every_cortex_error_has_a_status(error: cortex.CortexError, status: int) -> None:
    assert status_for(error) == status
    assert error_body(error) == {"error": type(error).__name__, "detail": "x"}


def test_every_public_error_class_is_mapped_deliberately() -> None:
    from cortex.asgi import HTTP_STATUS

    mapped = {cls for cls, _ in HTTP_STATUS}
    public = {
        getattr(cortex, n)
        for n in cortex.__all__
        if isinstance(getattr(cortex, n), type) and issubclass(getattr(cortex, n), Exception)
    }
    assert public <= mapped
