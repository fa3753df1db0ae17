"""The one error type of Strata: every failure a user can act on is a ``StrataError`` of one kind, and each kind
has its own exit code, the same in every command (the README's table of exit codes is this module's).

Anything else that escapes a command is an internal error (exit 1): a bug, or a failure nobody foresaw.
"""

from __future__ import annotations

from schemas.config import ConfigError

#: exit code of each kind of failure (0: success)
EXIT_CODES = {
    "internal": 1,  # a bug or an unforeseen failure (STRATA_DEBUG=1 prints its traceback)
    "usage": 2,  # a wrong flag, option value, setting or argument: fix the command
    "not_found": 3,  # the index, snapshot, corpus, dataset or file named does not exist
    "damaged": 4,  # the index exists but a table cannot be read, or a snapshot fails its expectations
    "refused": 5,  # the command is right but cannot go ahead now: another writer, a port in use, an unsafe setting
}


class StrataError(RuntimeError):
    """A failure with a clear message and the kind that gives its exit code."""

    kind = "internal"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]


class UsageError(StrataError, ValueError):
    kind = "usage"


class NotFoundError(StrataError):
    kind = "not_found"


class DamagedError(StrataError):
    kind = "damaged"


class RefusedError(StrataError):
    kind = "refused"


class CostCapReached(RefusedError):
    """The next LLM call could pass the run's cost cap (``llm.max_cost_usd``): it was not sent. Never quarantined as
    a chunk's or a summary's failure: the run stops, publishes nothing, and a rerun with a higher cap resumes from
    the answers already paid for (the response cache)."""


class TooLargeForTask(RefusedError):
    """A step that runs as one task would need more memory than a worker has: refused before it starts."""


class SnapshotGone(RefusedError):
    """The snapshot a read was pinned to was removed (``strata gc``) while it read: reading again takes the newest."""


def exit_code(exc: BaseException) -> int:
    """The exit code for ``exc``: its kind's, or a usage error's for a bad setting, or an internal error's."""

    if isinstance(exc, StrataError):
        return exc.exit_code
    if isinstance(exc, ConfigError):
        return EXIT_CODES["usage"]
    return EXIT_CODES["internal"]


class IndexError_(StrataError):
    """The index is missing, locked or inconsistent; the message says what to do."""


class IndexNotFound(IndexError_, NotFoundError):
    """No index, or no such snapshot, at the location."""


class IndexDamaged(IndexError_, DamagedError):
    """A table the snapshot pins cannot be read."""


class LockTimeout(IndexError_, RefusedError):
    """Another run is writing the index."""


class DiskFull(IndexError_, RefusedError):
    """The disk filled up while a table was written: nothing was committed."""


class StoreUnavailable(IndexError_, RefusedError):
    """The object store kept failing (throttling, dropped connections) past every retry: nothing was committed."""
