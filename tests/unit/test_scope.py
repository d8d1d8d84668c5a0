from __future__ import annotations

import asyncio
import pickle

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from cortex import InvalidScope, Scope, ScopeMissing, ScopeViolation, current_scope, use_scope


def test_constructors_agree() -> None:
    a, b = Scope("acme", "support"), Scope.parse("acme/support")
    assert a == b
    assert hash(a) == hash(b)
    assert str(a) == "acme/support"
    assert a.segments == ("acme", "support")
    assert a.depth == 2
    assert a.tenant == "acme"
    assert a.child("user-42") == Scope.parse("acme/support/user-42")
    assert pickle.loads(pickle.dumps(a)) == a


def test_immutable() -> None:
    scope = Scope("acme")
    with pytest.raises(AttributeError):
        scope._path = "other"


def test_contains_by_whole_segments() -> None:
    acme = Scope.parse("acme")
    assert acme.contains(Scope.parse("acme"))
    assert acme.contains(Scope.parse("acme/x/y"))
    assert not acme.contains(Scope.parse("acme-corp"))
    assert not acme.contains(Scope.parse("acmex/y"))
    assert not Scope.parse("acme/x").contains(acme)


@pytest.mark.parametrize(
    "path",
    ["", "/", "acme/", "/acme", "a//b", "a b", "a/b%", "é", "a" * 65, "/".join("a" * 9), "a\x00"],
)
def test_invalid_paths_name_the_segment(path: str) -> None:
    with pytest.raises(InvalidScope):
        Scope.parse(path)


def test_invalid_segment_is_named() -> None:
    with pytest.raises(InvalidScope, match="'bad seg'"):
        Scope("acme", "bad seg")


def test_valid_edge_segments() -> None:
    Scope.parse("A.b_c:d-e/" + "x" * 64)
    Scope.parse("/".join("a" * 8))


def test_current_scope_missing() -> None:
    with pytest.raises(ScopeMissing):
        current_scope()


def test_use_scope_restores_and_narrows_only() -> None:
    with use_scope("acme") as outer:
        assert current_scope() == outer
        with use_scope(Scope("acme", "support")):
            assert str(current_scope()) == "acme/support"
        assert current_scope() == outer
        with pytest.raises(ScopeViolation), use_scope("acme-corp"):
            pass
        with pytest.raises(ScopeViolation), use_scope("other"):
            pass
        assert current_scope() == outer
    with pytest.raises(ScopeMissing):
        current_scope()


def test_use_scope_restores_on_error() -> None:
    with pytest.raises(RuntimeError), use_scope("acme"):
        raise RuntimeError
    with pytest.raises(ScopeMissing):
        current_scope()


def test_use_scope_rejects_bad_path() -> None:
    with pytest.raises(InvalidScope), use_scope("a b"):
        pass


async def test_flows_into_task_groups_threads_and_tasks() -> None:
    seen: list[str] = []

    async def child() -> None:
        seen.append(str(current_scope()))

    with use_scope("acme/support"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(child)
        seen.append(await anyio.to_thread.run_sync(lambda: str(current_scope())))
        await asyncio.create_task(child())
    assert seen == ["acme/support"] * 3


async def test_never_leaks_to_tasks_started_outside() -> None:
    started = anyio.Event()
    release = anyio.Event()
    result: list[BaseException | str] = []

    async def outsider() -> None:
        started.set()
        await release.wait()
        try:
            result.append(str(current_scope()))
        except ScopeMissing as exc:
            result.append(exc)

    async with anyio.create_task_group() as tg:
        tg.start_soon(outsider)
        await started.wait()
        with use_scope("acme"):
            release.set()
            await anyio.sleep(0.01)
    assert isinstance(result[0], ScopeMissing)


async def test_concurrent_requests_keep_their_own_scope() -> None:
    mismatches = 0

    async def request(i: int) -> None:
        nonlocal mismatches
        with use_scope(f"tenant{i}/user"):
            for _ in range(20):
                await anyio.lowlevel.checkpoint()
                if str(current_scope()) != f"tenant{i}/user":
                    mismatches += 1

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(request, i)
    assert mismatches == 0
