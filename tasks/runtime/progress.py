"""Progress reporting for long stages: a tiny hook the CLI points at rich progress bars, or at one line per stage."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

log = logging.getLogger("strata")


class Reporter(Protocol):
    def start(self, stage: str, total: int | None) -> None: ...
    def advance(self, stage: str, n: int = 1) -> None: ...
    def finish(self, stage: str, summary: str = "") -> None: ...


class LineReporter:
    """One line per finished stage, handed to ``write``: its name, what it did (its summary, else the items it
    was started with) and its seconds, e.g. ``embed: 120 vectors (3.2 s)``."""

    def __init__(self, write: Callable[[str], None]):
        self.write = write
        self.started: dict[str, tuple[float, int | None]] = {}

    def start(self, stage: str, total: int | None) -> None:
        self.started[stage] = (time.perf_counter(), total)

    def advance(self, stage: str, n: int = 1) -> None:
        pass

    def finish(self, stage: str, summary: str = "") -> None:
        began, total = self.started.pop(stage, (time.perf_counter(), None))
        what = summary or (f"{total} items" if total is not None else "done")
        self.write(f"{stage}: {what} ({time.perf_counter() - began:.1f} s)")


class LogReporter(LineReporter):
    """Default: the line of each stage logged (``strata`` logger, info)."""

    def __init__(self) -> None:
        super().__init__(log.info)


_reporter: Reporter = LogReporter()


def reporter() -> Reporter:
    return _reporter


@contextlib.contextmanager
def use_reporter(rep: Reporter) -> Iterator[Reporter]:
    global _reporter
    previous, _reporter = _reporter, rep
    try:
        yield rep
    finally:
        _reporter = previous
