"""update_scope_data: merge patch or replacement of a scope's state, at or beneath the bound scope."""

from __future__ import annotations

import anyio
import pytest

import cortex
from cortex import InvalidInput, NewMessage, ScopeViolation, use_scope


async def test_merge_patch_semantics(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        doc = await store.update_scope_data({"plan": "pro", "limits": {"a": 1, "b": 2}})
        assert doc == {"plan": "pro", "limits": {"a": 1, "b": 2}}
        doc = await store.update_scope_data({"limits": {"b": None, "c": [1]}, "plan": None})
        assert doc == {"limits": {"a": 1, "c": [1]}}
        assert await store.get_scope_data() == doc
        doc = await store.update_scope_data({"only": None}, replace=True)
        assert doc == {"only": None}
        assert await store.get_scope_data() == {"only": None}


async def test_sessions_beneath_see_it_and_reserved_keys_stay(
    store: cortex.Store, tenant: str
) -> None:
    with use_scope(f"{tenant}/u1"):
        session = await store.create_session(
            "bot", scope_data={tenant: {"__cortex_mark": 1, "shared": "old"}}
        )
    with use_scope(tenant):
        await store.update_scope_data({"shared": "new"})
        await store.update_scope_data({"x": 1}, replace=True)
    with use_scope(f"{tenant}/u1"):
        seen = await store.get_session(session.id)
        assert seen.data == {"x": 1}
        await store.append_messages(
            session.id, [NewMessage("user", "hi")], scope_data={tenant: {"y": 2}}
        )
        assert (await store.get_session(session.id)).data == {"x": 1, "y": 2}


async def test_writes_never_reach_above_or_beside(store: cortex.Store, tenant: str) -> None:
    with use_scope(f"{tenant}/u1"):
        with pytest.raises(ScopeViolation):
            await store.update_scope_data({"a": 1}, scope=tenant)
        with pytest.raises(ScopeViolation):
            await store.update_scope_data({"a": 1}, scope=f"{tenant}/u10")
        assert await store.update_scope_data({"a": 1}, scope=f"{tenant}/u1/deep") == {"a": 1}
    with use_scope(tenant):
        assert await store.get_scope_data(f"{tenant}/u1/deep") == {"a": 1}
        assert await store.get_scope_data(f"{tenant}/u1") == {}


async def test_bad_input_and_size(store: cortex.Store, tenant: str) -> None:
    with use_scope(tenant):
        for bad in ({"": 1}, {"__cortex_x": 1}, {"k": float("nan")}):
            with pytest.raises(InvalidInput):
                await store.update_scope_data(bad)
        await store.update_scope_data({"big": "x" * 600_000})
        with pytest.raises(InvalidInput, match=r"1048576|limit"):
            await store.update_scope_data({"more": "y" * 600_000})
        assert set(await store.get_scope_data()) == {"big"}


async def test_concurrent_patches_all_land(store: cortex.Store, tenant: str) -> None:
    async def patch(i: int) -> None:
        with use_scope(tenant):
            await store.update_scope_data({f"k{i}": i})

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(patch, i)
    with use_scope(tenant):
        assert await store.get_scope_data() == {f"k{i}": i for i in range(20)}
