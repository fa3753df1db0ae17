"""The ``strata`` CLI with one kill point armed, for the crash matrix (``tests/test_crash_matrix.py``)::

    python -m tests.crash POINT strata-args...
    python -m tests.crash --serve        # a fork server: one kill per JSON line of stdin (the test uses this)

POINT says where the whole process group (the CLI, its Dask workers, Prefect's server) gets SIGKILL, as a
``kill -9`` of a job or the OOM killer would:

- ``after:STAGE[#N]``: when the N-th stage named STAGE (default the first) has finished — a stage boundary;
- ``during:STAGE[#N]``: at that stage's first progress step, with work done and work left — mid-extraction,
  mid-embedding;
- ``during:publish[#N]``: after the second table write of that publish, its snapshot not yet committed.

Before dying the process prints ``KILLED POINT`` to stderr, so a test can tell a kill from a normal exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys


def _die(point: str) -> None:
    sys.stderr.write(f"KILLED {point}\n")
    sys.stderr.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


def arm(point: str) -> None:
    """Patch the stage runner (or the catalog's table writer) so that ``point`` kills the process group."""
    from tasks.runtime.stages import Stages
    from tasks.store.catalog import Catalog

    when, _, target = point.partition(":")
    name, _, nth = target.partition("#")
    nth_n = int(nth or 1)
    if when not in ("after", "during") or not name:
        raise SystemExit(f"bad kill point {point!r}: after:STAGE[#N] or during:STAGE[#N]")
    seen = {"stages": 0, "writes": 0, "publishing": False}

    if target.startswith("publish") and when == "during":
        write = Catalog._write

        def write_then_die(self, *args, **kwargs):
            if seen["publishing"]:
                seen["writes"] += 1
                if seen["writes"] == 3:  # two tables rewritten, the snapshot not committed
                    _die(point)
            return write(self, *args, **kwargs)

        setattr(Catalog, "_write", write_then_die)  # noqa: B010 - patched for this process only

    call = getattr(Stages.__call__, "__wrapped__")  # noqa: B009 - the generator behind the context manager

    @contextlib.contextmanager
    def stage(self, stage_name, total=None):
        counted = stage_name == name
        if counted:
            seen["stages"] += 1
        armed = counted and seen["stages"] == nth_n
        with contextlib.contextmanager(call)(self, stage_name, total) as st:
            if armed and when == "during":
                if name == "publish":
                    seen["publishing"] = True
                else:
                    st.advance = lambda n=1, _st=st: _die(point)
            yield st
        if armed and when == "after":
            _die(point)

    setattr(Stages, "__call__", stage)  # noqa: B010 - patched for this process only


def run(point: str | None, args: list[str]) -> int:
    """The CLI on ``args`` with ``point`` armed (None: a plain run); its exit code when it was not killed."""
    if point:
        arm(point)
    from flows.cli import app

    try:
        app(args, prog_name="strata")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    if point:
        sys.stderr.write(f"NOT KILLED: {point} was never reached (exit {code})\n")
        return 3
    return code


def serve() -> None:
    """A fork server: imports the CLI's libraries once (about 5 s), then runs each request of stdin — one JSON
    line ``{"point", "args", "env", "log"}`` — in a forked child with a process group of its own, its output
    in ``log``, and answers one JSON line ``{"status"}`` (the child's exit code, or minus the signal)."""
    import json
    import warnings

    # nothing runs in this process but imports: no LanceDB operation can be in flight at a fork
    warnings.filterwarnings("ignore", message="lancedb fork support is experimental")
    import great_expectations  # noqa: F401
    import spacy  # noqa: F401

    import flows.index_flow  # noqa: F401 - prefect, lancedb, pyarrow, polars
    import flows.pipeline  # noqa: F401

    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: its own group, so that a kill takes it and its workers, not this server
            os.setsid()
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.environ.update(req.get("env") or {})
            code = 1
            try:
                code = run(req["point"], req["args"])
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"status": code}), flush=True)


def main(argv: list[str]) -> None:
    if argv == ["--serve"]:
        serve()
        return
    if os.getpgrp() != os.getpid():
        os.setsid()  # a group of its own: the kill must not take the shell or script that started it
    sys.exit(run(argv[0], argv[1:]))


if __name__ == "__main__":
    main(sys.argv[1:])
