"""Scenario ``telemetry``: what ``cortex.telemetry`` costs a store call, off and on.

One task calls ``get_session`` on one session, in blocks of ``n`` calls,
the sides interleaved and rotated block by block:

- ``base``: the method beneath the observer hook (``Store.get_session.__wrapped__``),
  the call as it was before the hook existed;
- ``off``: the public method on a store never instrumented (the hook's None check);
- ``metrics``: instrumented, OpenTelemetry's no-op tracer provider (Prometheus only);
- ``spans + metrics``: instrumented, the OpenTelemetry SDK recording every span
  through a batch processor to an exporter that drops them.

Then the same four sides on a stand-in store whose ``get_session`` returns at
once: what telemetry itself costs a call, without the database's noise.

Needs the ``telemetry`` extra and ``opentelemetry-sdk`` (both in ``bench``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import NoOpTracerProvider
from prometheus_client import CollectorRegistry

import cortex
from benchmarks._common import BenchDatabase
from cortex import use_scope
from cortex._observe import Observer, observed
from cortex.telemetry import instrument, uninstrument

TENANT = "bench"


@dataclass(frozen=True)
class Params:
    n: int = 2000
    blocks: int = 20


class _Dropped(SpanExporter):
    """Takes every span and keeps none: the SDK's whole cost, no network."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


async def _block(call: Callable[[], Awaitable[Any]], n: int) -> tuple[float, float]:
    """Wall and client CPU microseconds per call over ``n`` calls.

    CPU is the process's, every thread (the SDK exports from one of its
    own): it leaves out the database's time, and most of a shared machine's noise.
    """
    started, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await call()
    return (
        (time.perf_counter() - started) / n * 1e6,
        (time.process_time() - cpu) / n * 1e6,
    )


class _StandIn:
    """A store whose one method does nothing: the hook and the observer, alone."""

    def __init__(self) -> None:
        self._observer: Observer | None = None

    @observed
    async def get_session(self, session_id: str) -> list[str]:
        return [session_id]


async def _in_process(provider: TracerProvider, n: int) -> dict[str, float]:
    """Nanoseconds per call of each side on the stand-in, best of five blocks."""
    stand_in = _StandIn()
    # functools.wraps keeps the method beneath the hook there; the type says nothing of it.
    beneath = _StandIn.get_session.__wrapped__  # type: ignore[attr-defined]
    sides: dict[str, tuple[Any, Callable[[], Awaitable[Any]]]] = {
        "base": (None, lambda: beneath(stand_in, "x")),
        "off": (None, lambda: stand_in.get_session("x")),
        "metrics": (NoOpTracerProvider(), lambda: stand_in.get_session("x")),
        "spans + metrics": (provider, lambda: stand_in.get_session("x")),
    }
    best: dict[str, float] = {}
    for name, (tracer_provider, call) in sides.items():
        stand_in._observer = None
        if tracer_provider is not None:
            # The observer needs only the hook's attribute; the pool gauge is never read here.
            instrument(stand_in, tracer_provider=tracer_provider, registry=CollectorRegistry())  # type: ignore[arg-type]
        best[name] = min([(await _block(call, n))[1] * 1000 for _ in range(5)])
    return best


async def run(db: BenchDatabase, p: Params) -> tuple[list[dict[str, Any]], bool]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    ok = True
    async with cortex.connect(db.app_url, pool_size=1, max_overflow=0) as store:
        with use_scope(TENANT):
            session = await store.create_session("bench")
            sid = session.id
            # functools.wraps keeps the method beneath the hook there; the type says nothing of it.
            beneath = cortex.Store.get_session.__wrapped__  # type: ignore[attr-defined]

            async def base() -> Any:
                return await beneath(store, sid)

            async def public() -> Any:
                return await store.get_session(sid)

            def on(tracer_provider: Any) -> Callable[[], None]:
                def setup() -> None:
                    instrument(store, tracer_provider=tracer_provider, registry=CollectorRegistry())

                return setup

            sides: dict[str, tuple[Callable[[], None] | None, Callable[[], Awaitable[Any]]]] = {
                "base": (None, base),
                "off": (None, public),
                "metrics": (on(NoOpTracerProvider()), public),
                "spans + metrics": (on(provider), public),
            }
            names = list(sides)
            samples: dict[str, list[float]] = {name: [] for name in names}
            cpu: dict[str, list[float]] = {name: [] for name in names}
            for name in names:  # warm every path once
                setup, call = sides[name]
                if setup is not None:
                    setup()
                await _block(call, max(1, p.n // 10))
                uninstrument(store)
            for block in range(p.blocks):
                shift = block % len(names)
                for name in names[shift:] + names[:shift]:
                    setup, call = sides[name]
                    if setup is not None:
                        setup()
                    wall, used = await _block(call, p.n)
                    samples[name].append(wall)
                    cpu[name].append(used)
                    uninstrument(store)
            ok = (await store.get_session(sid)).id == sid
    in_process = await _in_process(provider, 20 * p.n)
    provider.shutdown()
    base_us = statistics.median(samples["base"])
    base_cpu = statistics.median(cpu["base"])
    results = []
    print("  median of blocks, µs per call")
    print(f"  {'side':<16} {'wall':>8} {'vs base':>8} {'CPU':>8} {'+CPU':>8}")
    for name in names:
        median = statistics.median(samples[name])
        used = statistics.median(cpu[name])
        print(
            f"  {name:<16} {median:>8.1f} {median / base_us:>7.3f}x"
            f" {used:>8.1f} {used - base_cpu:>+8.1f}"
        )
        results.append(
            {
                "side": name,
                "calls_per_block": p.n,
                "blocks": p.blocks,
                "median_us_per_call": round(median, 2),
                "min_us_per_call": round(min(samples[name]), 2),
                "max_us_per_call": round(max(samples[name]), 2),
                "vs_base": round(median / base_us, 4),
                "median_cpu_us_per_call": round(used, 2),
                "cpu_us_over_base": round(used - base_cpu, 2),
            }
        )
    print("  in process, no database: CPU ns per call (best of 5 blocks)")
    for name, ns in in_process.items():
        print(f"  {name:<16} {ns:>8.0f} {ns - in_process['base']:>+8.0f}")
        results.append({"side": f"in process: {name}", "cpu_ns_per_call": round(ns)})
    return results, ok
