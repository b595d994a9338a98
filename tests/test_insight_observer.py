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


def mark(*, statement_marks: bool = False) -> TraceMark:
    return TraceMark(
        at=1.0,
        wal_lsn=0,
        layer=Layer(logical_bytes=0, physical_bytes=0),
        relations=[],
        interval=0.05,
        instrumented=True,
        statement_marks=statement_marks,
    )


class FakeEngine:
    """The trace part of an Engine, failing where told to."""

    def __init__(
        self, *, fail_begin: bool = False, fail_mark: bool = False, marks: bool = False
    ) -> None:
        self.fail_begin, self.fail_mark, self.marks = fail_begin, fail_mark, marks
        self.calls: list[str] = []

    def trace_begin(self, name: str, request: TraceRequest) -> TraceMark:
        self.calls.append("begin")
        if self.fail_begin:
            raise TraceError(f"branch {name} is not running, so it cannot be traced")
        return mark(statement_marks=self.marks)

    def trace_mark(self, name: str, *, repository: str | None = None) -> TraceMark:
        self.calls.append("mark")
        if self.fail_mark:
            raise TraceError(f"cannot take a mark of the trace of branch {name}")
        return mark(statement_marks=self.marks)

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


def test_files_are_marked_only_where_the_base_has_the_statement_procedure() -> None:
    sql = "UPDATE t SET a = 1;\n"
    with observer(FakeEngine(marks=True)) as o:
        o.start()
        marked = o.marked(sql, single_transaction=True)
        assert marked is not None and "pgoverlay_trace.statement_end(" in marked
        found = o.measure(text=sql, seconds=0.1, single_transaction=True, ignore_pids=())
        assert found is not None
        assert not any("before statement marks existed" in n for n in found.notes)
    with observer(FakeEngine(marks=False)) as o:
        o.start()
        assert o.marked(sql, single_transaction=True) is None
        found = o.measure(text=sql, seconds=0.1, single_transaction=True, ignore_pids=())
        assert found is not None
        assert any("the base was prepared before statement marks existed" in n for n in found.notes)
