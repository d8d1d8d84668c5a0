"""Model-based test: random sequences of store operations against a plain in-memory model.

Hypothesis drives create, get, update, delete, append, fork, rewind, list,
count, iterate, resolve and set-default across scopes chosen to be hostile to prefix matching
(``acme`` beside ``acme-corp``, ``acme_corp``, ``acme.corp``, ``Acme``,
``acme:1``, a 64-character segment) and several agents. Every result is
checked against the model: visibility, order, counts, defaults, counters.

Budget: ``CORTEX_MODEL_EXAMPLES`` (default 25 runs of up to 30 steps) keeps CI
bounded; raise it to run longer on demand.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

import cortex
from cortex import (
    AlreadyAborted,
    Conflict,
    FunctionResponse,
    InvalidInput,
    ListFilter,
    NewMessage,
    NotFound,
    RequestedInput,
    Scope,
    SessionAborted,
    SessionState,
    use_scope,
)
from tests.figures import record

pytestmark = pytest.mark.reliability

EXAMPLES = int(os.environ.get("CORTEX_MODEL_EXAMPLES", "25"))
TENANTS = ["acme", "acme-corp", "Acme"]
# acme_corp, acme.corp and acme:1 sort around acme-corp byte-wise; the probe
# below checks them too.
PROBE_TENANTS = ["acme", "acme-corp", "acme_corp", "acme.corp", "Acme", "acme:1"]
PATHS = ["", "/x", "/x-y", "/x/y", "/x/y-z", "/x/y/z"]
PROBE_PATHS = [*PATHS, "/x/y.z/w", "/x/" + "s" * 64, "/x/y/z/a/b/c/d"]
AGENTS = ["bot", "bot-2", "Bot"]
WORDS = ["alpha", "50%_off", "a_b", "x\\y", "ALPHA beta"]
TERMS = ["alpha", "%", "_", "50%_", "\\", "beta", "zzz"]


@dataclass
class ModelSession:
    id: str
    agent: str
    scope: Scope
    title: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    is_default: bool = False
    messages: list[str] = field(default_factory=list)
    clock: int = 0  # logical updated_at
    asked: list[tuple[int, str]] = field(default_factory=list)  # (seq, interrupt id)
    answered: list[tuple[int, str]] = field(default_factory=list)
    aborted: bool = False
    interrupted: bool = False
    updated: Any = None  # updated_at read back after concurrent appends

    def pending(self) -> list[str]:
        return [i for seq, i in self.asked if not any(a == i and s > seq for s, a in self.answered)]

    def state(self) -> SessionState:
        if self.aborted:
            return SessionState.ABORTED
        if self.pending():
            return SessionState.PAUSED
        return SessionState.INTERRUPTED if self.interrupted else SessionState.IDLE

    def preview(self) -> str:
        return self.messages[-1][:256] if self.messages else ""


class StoreModel(RuleBasedStateMachine):
    store: cortex.Store
    portal: anyio.from_thread.BlockingPortal
    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.run = uuid.uuid4().hex[:6]
        self.sessions: dict[str, ModelSession] = {}
        self.clock = 0

    # -- helpers -------------------------------------------------------------

    def scope(self, tenant: str, path: str) -> Scope:
        return Scope.parse(f"{tenant}{self.run}{path}")

    def call(self, scope: Scope, fn: Any, *args: Any, **kwargs: Any) -> Any:
        StoreModel.steps += 1

        async def go() -> Any:
            with use_scope(scope):
                return await fn(*args, **kwargs)

        return self.portal.call(go)

    def tick(self, s: ModelSession) -> None:
        self.clock += 1
        s.clock = self.clock

    def visible(self, scope: Scope) -> list[ModelSession]:
        return [s for s in self.sessions.values() if scope.contains(s.scope)]

    def expected(self, scope: Scope, flt: ListFilter) -> list[str]:
        found = []
        for s in self.visible(scope):
            if flt.exact and s.scope != scope:
                continue
            if flt.agent_id is not None and s.agent != flt.agent_id:
                continue
            if flt.default_only and not s.is_default:
                continue
            if flt.search and not (
                flt.search.lower() in s.title.lower() or flt.search.lower() in s.preview().lower()
            ):
                continue
            found.append(s)
        found.sort(key=lambda s: (s.clock, s.id), reverse=True)
        return [s.id for s in found]

    def pick(self, data: st.DataObject) -> ModelSession | None:
        if not self.sessions:
            return None
        return self.sessions[data.draw(st.sampled_from(sorted(self.sessions)))]

    # -- rules -------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        self.sessions.clear()
        record("model: random operation sequences")

    @rule(
        tenant=st.sampled_from(TENANTS),
        path=st.sampled_from(PATHS),
        agent=st.sampled_from(AGENTS),
        title=st.sampled_from(["", *WORDS]),
        default=st.booleans(),
    )
    def create(self, tenant: str, path: str, agent: str, title: str, default: bool) -> None:
        scope = self.scope(tenant, path)
        taken = any(
            s.is_default and s.agent == agent and s.scope == scope for s in self.sessions.values()
        )
        try:
            got = self.call(
                scope, self.store.create_session, agent, title=title, is_default=default
            )
        except Conflict:
            assert default
            assert taken
            return
        assert not (default and taken)
        assert got.scope == scope
        s = ModelSession(got.id, agent, scope, title=title, is_default=default)
        self.tick(s)
        self.sessions[got.id] = s

    @rule(data=st.data(), tenant=st.sampled_from(TENANTS), path=st.sampled_from(PATHS))
    def get(self, data: st.DataObject, tenant: str, path: str) -> None:
        s = self.pick(data)
        if s is None:
            return
        scope = self.scope(tenant, path)
        try:
            got = self.call(scope, self.store.get_session, s.id)
        except NotFound:
            assert not scope.contains(s.scope)
            return
        assert scope.contains(s.scope)
        assert (got.agent_id, got.scope, got.title, got.is_default) == (
            s.agent,
            s.scope,
            s.title,
            s.is_default,
        )
        assert got.message_count == len(s.messages)
        assert got.last_message == s.preview()

    @rule(data=st.data())
    def probe_visibility(self, data: st.DataObject) -> None:
        """One session, read from every scope in the pool: visible exactly from above."""
        s = self.pick(data)
        if s is None:
            return
        for tenant in PROBE_TENANTS:
            for path in PROBE_PATHS:
                scope = self.scope(tenant, path)
                try:
                    self.call(scope, self.store.get_session, s.id)
                    seen = True
                except NotFound:
                    seen = False
                assert seen == scope.contains(s.scope), (str(scope), str(s.scope))

    @rule(data=st.data(), title=st.sampled_from(WORDS), via_parent=st.booleans())
    def update(self, data: st.DataObject, title: str, via_parent: bool) -> None:
        s = self.pick(data)
        if s is None:
            return
        scope = Scope(*s.scope.segments[:1]) if via_parent else s.scope
        current = self.call(scope, self.store.get_session, s.id)
        current.title = title
        current.metadata = {"t": title}
        self.call(scope, self.store.update_session, current)
        s.title, s.metadata = title, {"t": title}
        self.tick(s)

    @rule(data=st.data(), tenant=st.sampled_from(TENANTS), path=st.sampled_from(PATHS))
    def delete(self, data: st.DataObject, tenant: str, path: str) -> None:
        s = self.pick(data)
        if s is None:
            return
        scope = self.scope(tenant, path)
        try:
            self.call(scope, self.store.delete_session, s.id)
        except NotFound:
            assert not scope.contains(s.scope)
            return
        assert scope.contains(s.scope)
        del self.sessions[s.id]

    @rule(data=st.data(), words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))
    def append(self, data: st.DataObject, words: list[str]) -> None:
        s = self.pick(data)
        if s is None:
            return
        stored = self.call(
            s.scope, self.store.append_messages, s.id, [NewMessage("user", w) for w in words]
        )
        assert [m.seq for m in stored] == list(
            range(len(s.messages) + 1, len(s.messages) + len(words) + 1)
        )
        s.messages.extend(words)
        self.tick(s)

    @rule(
        tenant=st.sampled_from(TENANTS),
        path=st.sampled_from(PATHS),
        exact=st.booleans(),
        agent=st.sampled_from([None, *AGENTS]),
        default_only=st.booleans(),
        term=st.sampled_from([None, *TERMS]),
    )
    def list_and_count(
        self,
        tenant: str,
        path: str,
        exact: bool,
        agent: str | None,
        default_only: bool,
        term: str | None,
    ) -> None:
        scope = self.scope(tenant, path)
        flt = ListFilter(
            exact=exact, agent_id=agent, default_only=default_only, search=term, limit=1000
        )
        want = self.expected(scope, flt)
        assert [s.id for s in self.call(scope, self.store.list_sessions, flt)] == want
        assert self.call(scope, self.store.count_sessions, flt) == len(want)

        async def iterate() -> list[str]:
            with use_scope(scope):
                return [
                    s.id
                    async for s in self.store.iter_sessions(flt.model_copy(update={"limit": 2}))
                ]

        assert self.portal.call(iterate) == want

    @rule(
        tenant=st.sampled_from(TENANTS), path=st.sampled_from(PATHS), agent=st.sampled_from(AGENTS)
    )
    def resolve(self, tenant: str, path: str, agent: str) -> None:
        scope = self.scope(tenant, path)
        got = self.call(scope, self.store.resolve_session, agent)
        existing = [
            s
            for s in self.sessions.values()
            if s.is_default and s.agent == agent and s.scope == scope
        ]
        if existing:
            assert got.id == existing[0].id
            return
        assert got.is_default
        s = ModelSession(got.id, agent, scope, is_default=True)
        self.tick(s)
        self.sessions[got.id] = s

    @rule(data=st.data())
    def set_default(self, data: st.DataObject) -> None:
        s = self.pick(data)
        if s is None:
            return
        self.call(Scope(*s.scope.segments[:1]), self.store.set_default_session, s.id)
        for other in self.sessions.values():
            if other.agent == s.agent and other.scope == s.scope:
                other.is_default = other.id == s.id

    @rule(data=st.data(), interrupt=st.sampled_from(["i1", "i2"]), answer=st.booleans())
    def ask_or_answer(self, data: st.DataObject, interrupt: str, answer: bool) -> None:
        s = self.pick(data)
        if s is None:
            return
        message = (
            NewMessage("user", function_response=FunctionResponse(id=interrupt))
            if answer
            else NewMessage("assistant", requested_input=RequestedInput(interrupt_id=interrupt))
        )
        (stored,) = self.call(s.scope, self.store.append_messages, s.id, [message])
        s.messages.append("")
        (s.answered if answer else s.asked).append((stored.seq, interrupt))
        self.tick(s)

    @rule(data=st.data(), interrupt=st.sampled_from(["i1", "i2", "never"]))
    def resume(self, data: st.DataObject, interrupt: str) -> None:
        s = self.pick(data)
        if s is None:
            return
        try:
            stored = self.call(s.scope, self.store.resume, s.id, interrupt, {"ok": True})
        except SessionAborted:
            assert s.aborted
            return
        except Conflict:
            assert not s.aborted
            assert interrupt not in s.pending()
            assert any(i == interrupt for _, i in s.asked)
            return
        except NotFound:
            assert not s.aborted
            assert not any(i == interrupt for _, i in s.asked)
            return
        assert not s.aborted
        assert interrupt in s.pending()
        s.messages.append("")
        s.answered.append((stored.seq, interrupt))
        self.tick(s)

    @rule(data=st.data())
    def mark_or_clear(self, data: st.DataObject) -> None:
        s = self.pick(data)
        if s is None:
            return
        if data.draw(st.booleans()):
            self.call(s.scope, self.store.mark_interrupted, s.id, "drain")
            s.interrupted = True
        else:
            self.call(s.scope, self.store.clear_interrupted, s.id)
            s.interrupted = False

    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        s = self.pick(data)
        if s is None:
            return
        try:
            self.call(s.scope, self.store.abort_session, s.id, "stop")
        except AlreadyAborted:
            assert s.aborted
            return
        assert not s.aborted
        s.aborted = True

    @rule(data=st.data())
    def inspect(self, data: st.DataObject) -> None:
        s = self.pick(data)
        if s is None:
            return
        detail = self.call(s.scope, self.store.inspect_session, s.id)
        assert detail.state is s.state()
        assert [p.interrupt_id for p in detail.pending] == ([] if s.aborted else s.pending())
        for state in SessionState:
            flt = ListFilter(state=state, limit=1000)
            listed = {x.id for x in self.call(s.scope, self.store.list_sessions, flt)}
            assert (s.id in listed) == (state is s.state())

    @rule(data=st.data(), back=st.integers(-1, 4))
    def rewind(self, data: st.DataObject, back: int) -> None:
        """Back ``back`` messages (-1: one past the end, refused)."""
        s = self.pick(data)
        if s is None:
            return
        to_seq = max(0, len(s.messages) - back)
        try:
            got = self.call(s.scope, self.store.rewind_session, s.id, to_seq=to_seq)
        except SessionAborted:
            assert s.aborted
            return
        except InvalidInput:
            assert to_seq > len(s.messages)
            return
        assert not s.aborted
        removed = to_seq < len(s.messages)
        del s.messages[to_seq:]
        s.asked = [(seq, i) for seq, i in s.asked if seq <= to_seq]
        s.answered = [(seq, i) for seq, i in s.answered if seq <= to_seq]
        assert (got.message_count, got.last_message) == (len(s.messages), s.preview())
        assert (got.state, got.pending_count) == (s.state(), len(s.pending()))
        if removed:
            self.tick(s)

    @rule(data=st.data(), back=st.integers(0, 3), via_tenant=st.booleans())
    def fork(self, data: st.DataObject, back: int, via_tenant: bool) -> None:
        s = self.pick(data)
        if s is None:
            return
        through = max(0, len(s.messages) - back)
        scope = Scope(*s.scope.segments[:1]) if via_tenant else s.scope
        got = self.call(scope, self.store.fork_session, s.id, through_seq=through)
        f = ModelSession(
            got.id,
            s.agent,
            s.scope,
            title=s.title,
            metadata=dict(s.metadata),
            messages=s.messages[:through],
            asked=[(seq, i) for seq, i in s.asked if seq <= through],
            answered=[(seq, i) for seq, i in s.answered if seq <= through],
        )
        assert got.forked_from is not None
        assert (got.forked_from.session_id, got.forked_from.seq) == (s.id, through)
        assert (got.agent_id, got.scope, got.title, got.metadata) == (
            f.agent,
            f.scope,
            f.title,
            f.metadata,
        )
        assert (got.message_count, got.last_message, got.is_default) == (
            through,
            f.preview(),
            False,
        )
        assert (got.state, got.pending_count) == (f.state(), len(f.pending()))
        self.tick(f)
        self.sessions[got.id] = f

    @rule(data=st.data(), words=st.lists(st.sampled_from(WORDS), min_size=2, max_size=4))
    def concurrent_appends(self, data: st.DataObject, words: list[str]) -> None:
        """Several sessions (and repeats of one) appended to at once."""
        if not self.sessions:
            return
        targets = [self.pick(data) for _ in words]

        async def go() -> None:
            async with anyio.create_task_group() as tg:
                for target, word in zip(targets, words, strict=True):
                    assert target is not None

                    async def one(t: ModelSession = target, w: str = word) -> None:
                        with use_scope(t.scope):
                            await self.store.append_message(t.id, NewMessage("user", w))

                    tg.start_soon(one)

        StoreModel.steps += len(words)
        self.portal.call(go)
        # Which of two concurrent appends to one session lands last is not
        # the contract's to say: read the order back, check everything else.
        touched = {t.id: t for t in targets if t is not None}
        for t in touched.values():
            got = self.call(t.scope, self.store.get_session, t.id)
            count = sum(1 for x in targets if x is not None and x.id == t.id)
            assert got.message_count == len(t.messages) + count
            stored = self.call(t.scope, self.store.list_messages, t.id, after_seq=len(t.messages))
            assert [m.seq for m in stored] == list(
                range(len(t.messages) + 1, got.message_count + 1)
            )
            t.messages.extend(m.content for m in stored)
            t.updated = got.updated_at
        for t in sorted(touched.values(), key=lambda x: (x.updated, x.id)):
            self.tick(t)

    @invariant()
    def one_default_per_pair(self) -> None:
        pairs = [(s.agent, s.scope) for s in self.sessions.values() if s.is_default]
        assert len(pairs) == len(set(pairs))


def _check_against_the_model(
    store: cortex.Store, portal: anyio.from_thread.BlockingPortal, examples: int
) -> None:
    StoreModel.store = store
    StoreModel.portal = portal
    StoreModel.steps = 0
    run_state_machine_as_test(
        StoreModel,
        settings=settings(
            max_examples=examples,
            stateful_step_count=30,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    # The budget really ran: hypothesis drove the store, not an empty loop.
    assert StoreModel.steps >= examples * 5


def test_store_matches_the_model(
    portal_store: cortex.Store, portal: anyio.from_thread.BlockingPortal
) -> None:
    _check_against_the_model(portal_store, portal, EXAMPLES)
    record("model: store calls checked against the model", StoreModel.steps)


def test_router_forms_match_the_model(
    portal_router_store: cortex.Store, portal: anyio.from_thread.BlockingPortal
) -> None:
    """The statements a Citus store sends (conftest.portal_router_store) against the same model."""
    _check_against_the_model(portal_router_store, portal, max(1, EXAMPLES // 2))
