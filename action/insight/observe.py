"""Measuring migrations while they run: the engine traces the branch, this module asks for a
mark after each migration and turns the two marks around it into a ``MigrationInsight``; with
``probing``, the probe (``probe``) runs on the tables each migration touches while it runs, and
its sessions are left out of the trace.

Measuring never fails a migration: when the engine cannot trace (an older service, a branch
that stopped), the migrations run as they would without it and their runs carry no insight;
the reason is kept in ``Observer.problem`` for the report.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection
from types import TracebackType

from pgoverlay.action import migrations
from pgoverlay.action.insight import analyze, lint, marks, probe, schemadiff
from pgoverlay.action.insight.model import MigrationInsight, Thresholds
from pgoverlay.errors import PgoverlayError
from pgoverlay.runner.service.engine import Engine
from pgoverlay.runner.service.models import TraceRequest
from pgoverlay.runner.service.views import TraceMark

log = logging.getLogger(__name__)


class Observer:
    """A trace of branch ``name``, from ``start`` to the end of a ``with`` block; a
    ``migrations.Watcher``."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        *,
        repository: str | None,
        thresholds: Thresholds,
        pg_major: int,
        max_seconds: float,
        interval: float = 0.05,
        probing: probe.Options | None = None,
    ) -> None:
        self.engine = engine
        self.name = name
        self.repository = repository
        self.thresholds = thresholds
        self.pg_major = pg_major
        self.request = TraceRequest(
            repository=repository, interval=interval, max_seconds=max_seconds
        )
        self.problem = ""  # why migrations were not measured, when they were not
        self.schema_diff: schemadiff.SchemaDiff | None = None  # at the trace's end
        self._last: TraceMark | None = None
        self._book: analyze.Book | None = None
        self._started = False
        self._opened = False  # the engine holds a trace this observer must end
        self._marked: marks.Marked | None = None  # the migration now running, as psql read it
        self.probing = probing  # probe each migration's tables on live traffic
        self._probe: probe.Probe | None = None

    def __enter__(self) -> Observer:
        return self

    def start(self) -> None:
        """Open the trace, once: called when the workflow's own sessions on the branch are
        open (a trace waits, at each mark, for the sessions opened since the one before to
        end), just before the first migration runs."""
        if self._started:
            return
        self._started = True
        try:
            first = self.engine.trace_begin(self.name, self.request)
        except PgoverlayError as err:
            self._give_up(f"the migrations were not measured: {err}")
            return
        self._last, self._book, self._opened = first, analyze.Book(first), True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop_probe()
        opened = self._opened
        self._last = self._book = None
        self._opened = False
        if not opened:
            return
        try:
            last = self.engine.trace_end(self.name, repository=self.repository)
            if last.schema_diff is not None:
                self.schema_diff = schemadiff.of_view(last.schema_diff)
        except PgoverlayError as problem:
            log.warning("branch %s: the trace did not end cleanly: %s", self.name, problem)

    def _give_up(self, why: str) -> None:
        """Measure no more (an opened trace is still ended on leaving the block)."""
        log.warning("branch %s: %s", self.name, why)
        self.problem = self.problem or why
        self._last = self._book = None

    def marked(self, text: str, *, single_transaction: bool) -> str | None:
        """The file with a statement mark after each statement (``marks``), when the trace can
        read them; None (run the file as it is) otherwise."""
        self._marked = None
        if self._last is None or not self._last.statement_marks:
            return None
        found = marks.instrument(
            text, nonce=marks.new_nonce(), single_transaction=single_transaction
        )
        self._marked = found
        return found.text if found.marked else None
    def starting(self, *, text: str | None) -> None:
        """A migration is about to run (``text``: its SQL; None for a migrate command): probe
        the tables it touches while it runs, if this observer probes and still measures."""
        self._stop_probe()
        if self.probing is None or self._last is None:
            return
        self._probe = probe.Probe(self.probing)
        self._probe.start(text=text)

    def _stop_probe(self) -> probe.Outcome | None:
        found, self._probe = self._probe, None
        return found.stop() if found is not None else None

    def measure(
        self,
        *,
        text: str | None,
        seconds: float,
        single_transaction: bool,
        ignore_pids: Collection[int],
    ) -> MigrationInsight | None:
        """What the migration that just ended did: ``text`` is its SQL (None for a migrate
        command, whose statements come from the server's log)."""
        probed = self._stop_probe()  # its sessions end before the mark, which waits for them
        marked, self._marked = self._marked, None
        if self._last is None or self._book is None:
            return None
        if probed is not None:
            ignore_pids = {*ignore_pids, *probed.pids}
        # A trace whose event triggers are in place but whose base has no statement procedure.
        unmarkable = self._last.instrumented and not self._last.statement_marks
        try:
            mark = self.engine.trace_mark(self.name, repository=self.repository)
        except PgoverlayError as err:
            self._give_up(f"measuring stopped: {err}")
            return None
        before, after = self._book.advance(mark)
        found = (
            lint.run(text, pg_version=self.pg_major or 14, in_transaction=single_transaction)
            if text is not None
            else lint.Lint([])
        )
        insight = analyze.analyze(
            before=self._last,
            after=mark,
            relations_before=before,
            relations_after=after,
            seconds=seconds,
            statements=_statements(text, marked),
            ignore_pids=ignore_pids,
            lint=found.findings,
            thresholds=self.thresholds,
            marked=marked,
        )
        self._last = mark
        notes = list(insight.notes)
        if text is not None and unmarkable:
            notes.append(
                "the base was prepared before statement marks existed: the locks of statements "
                "that fire no event trigger (DML, TRUNCATE, LOCK TABLE, CLUSTER, REINDEX, "
                "VACUUM FULL) are inferred or sampled, not exact; seed the base again "
                "(`pgoverlay base seed BASE --refresh --from DSN`) for exact locks"
            )
        elif marked is not None and marked.reason:
            notes.append(marked.reason)
        if found.reason:
            notes.append(found.reason)
        if probed is not None:
            notes += probed.notes
            insight = dataclasses.replace(
                insight, blocking=probed.blocking, long_transaction=probed.long_transaction
            )
        return dataclasses.replace(insight, notes=notes) if notes != insight.notes else insight


def _statements(text: str | None, marked: marks.Marked | None) -> list[migrations.Statement] | None:
    """The file's statements (split once: a big file takes seconds), None for a command."""
    if text is None:
        return None
    if marked is not None and marked.statements is not None:
        return list(marked.statements)
    return migrations.statements(text)
