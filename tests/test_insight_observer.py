"""The Observer never fails a migration, and never leaves a trace open in the engine: a trace
that could not be opened, or a mark the engine refused, ends with the migrations unmeasured and
the reason kept for the report."""

from __future__ import annotations

from typing import Any

from pgoverlay.action.insight.model import Thresholds
from pgoverlay.action.insight.observe import Observer
from pgoverlay.errors import TraceError
from pgoverlay.runner.service.models import TraceRequest
from pgoverlay.runner.service.views import Layer, TraceMark


def mark() -> TraceMark:
    return TraceMark(
        at=1.0,
        wal_lsn=0,
        layer=Layer(logical_bytes=0, physical_bytes=0),
        relations=[],
        interval=0.05,
        instrumented=True,
    )


class FakeEngine:
    """The trace part of an Engine, failing where told to."""

    def __init__(self, *, fail_begin: bool = False, fail_mark: bool = False) -> None:
        self.fail_begin, self.fail_mark = fail_begin, fail_mark
        self.calls: list[str] = []

    def trace_begin(self, name: str, request: TraceRequest) -> TraceMark:
        self.calls.append("begin")
        if self.fail_begin:
            raise TraceError(f"branch {name} is not running, so it cannot be traced")
        return mark()

    def trace_mark(self, name: str, *, repository: str | None = None) -> TraceMark:
        self.calls.append("mark")
        if self.fail_mark:
            raise TraceError(f"cannot take a mark of the trace of branch {name}")
        return mark()

    def trace_end(self, name: str, *, repository: str | None = None) -> TraceMark:
        self.calls.append("end")
        return mark()


def observer(engine: Any) -> Observer:
    return Observer(
        engine, "b", repository=None, thresholds=Thresholds(), pg_major=15, max_seconds=60
    )


def measure(o: Observer) -> object:
    return o.measure(text=None, seconds=0.1, single_transaction=False, ignore_pids=())


def test_a_trace_that_cannot_open_measures_nothing_and_says_why() -> None:
    engine = FakeEngine(fail_begin=True)
    with observer(engine) as o:
        o.start()
        o.start()  # once only
        assert measure(o) is None
    assert engine.calls == ["begin"]
    assert o.problem.startswith("the migrations were not measured: branch b is not running")


def test_a_refused_mark_stops_measuring_but_still_ends_the_trace() -> None:
    engine = FakeEngine(fail_mark=True)
    with observer(engine) as o:
        o.start()
        assert measure(o) is None
        assert measure(o) is None  # no second attempt
    assert engine.calls == ["begin", "mark", "end"]
    assert o.problem.startswith("measuring stopped: cannot take a mark")


def test_a_trace_is_opened_only_when_the_workflow_starts_it() -> None:
    engine = FakeEngine()
    with observer(engine):
        pass
    assert engine.calls == []
    with observer(engine) as o:
        o.start()
        assert measure(o) is not None
    assert engine.calls == ["begin", "mark", "end"]
