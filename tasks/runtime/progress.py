"""Progress reporting for long stages: a tiny hook the CLI points at rich progress bars."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Protocol

log = logging.getLogger("strata")


class Reporter(Protocol):
    def start(self, stage: str, total: int | None) -> None: ...
    def advance(self, stage: str, n: int = 1) -> None: ...
    def finish(self, stage: str, summary: str = "") -> None: ...


class LogReporter:
    """Default: one log line per stage."""

    def start(self, stage: str, total: int | None) -> None:
        log.info("%s: started (%s items)", stage, total if total is not None else "?")

    def advance(self, stage: str, n: int = 1) -> None:
        pass

    def finish(self, stage: str, summary: str = "") -> None:
        log.info("%s: done %s", stage, summary)


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
