"""What every ``strata`` command shares: the app, the consoles, the options, one way to fail, progress bars.

Every command is registered with ``command``: a failure it raises becomes one ``error:`` line on stderr and the
exit code of its kind (``tasks.errors.EXIT_CODES``); nothing else reaches the user, unless ``STRATA_DEBUG=1``
asks for the traceback of an internal error.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from schemas.config import StrataConfig, load_config, parse_overrides
from tasks.errors import EXIT_CODES, exit_code


class OneLineUsageErrors(typer.core.TyperGroup):
    """The ``strata`` group: a usage error of any command (an unknown command or flag, a value out of range, a
    missing argument), found while parsing, ends as one ``error:`` line and its exit code (2), not typer's boxed
    panel. The one place that formats them: every command's arguments are parsed in this group's ``invoke``.
    ``--help``, and the help shown for no arguments, stay typer's."""

    def make_context(self, *args: Any, **kwargs: Any) -> Any:
        with usage_errors_in_one_line():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: Any) -> Any:
        with usage_errors_in_one_line():
            return super().invoke(ctx)


@contextlib.contextmanager
def usage_errors_in_one_line() -> Iterator[None]:
    """A parser error (typer's own click: its exceptions derive from ``typer.TyperException``) as one line naming
    the command's ``--help``."""
    from typer._click.exceptions import NoArgsIsHelpError

    try:
        yield
    except NoArgsIsHelpError:
        raise
    except typer.TyperException as exc:
        text = " ".join(exc.format_message().split())
        ctx = getattr(exc, "ctx", None)
        if ctx is not None:
            text += f" (see {ctx.command_path} --help)"
        error_line(text)
        raise typer.Exit(exc.exit_code) from None


app = typer.Typer(
    cls=OneLineUsageErrors,
    name="strata",
    help=(
        "Strata builds and serves a hierarchical knowledge-graph index (HiRAG) for graph RAG.\n\n"
        "Typical use:\n\n"
        "  strata init                      # write a commented strata.toml\n\n"
        "  strata index data/ --index ./index   # full build, offline by default\n\n"
        "  strata inspect --index ./index       # what is in the published snapshot\n\n"
        '  strata query "Who employed Bob Cratchit?" --index ./index\n\n'
        "  strata export --index ./index --format parquet --out ./export\n\n"
        "Exit codes: 0 success, 1 internal error, 2 usage error, 3 not found, 4 damaged index, 5 refused."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
console = Console(stderr=True, soft_wrap=True)
#: piped output: text never hard-wrapped, tables this wide (not the 80 columns rich assumes without a terminal)
PIPED_WIDTH = 160
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else PIPED_WIDTH)

IndexOpt = typer.Option(..., "--index", "-i", help="Index location: a folder or an s3:// URI (created if missing).")
ReadIndexOpt = typer.Option(
    ..., "--index", "-i", help="An existing index: a folder or an s3:// URI (never created by this command)."
)
ConfigOpt = typer.Option(
    None, "--config", "-c", help="strata.toml to use (default: $STRATA_CONFIG or built-in defaults)."
)
SetOpt = typer.Option(None, "--set", help="Override one setting, e.g. --set chunking.size=600 (repeatable).")
AsOfOpt = typer.Option(
    None, "--as-of", help="This snapshot version instead of the latest (see `strata inspect --versions`)."
)
LockOpt = typer.Option(0.0, help="Seconds to wait if another run is writing this index (then exit 5).")
MaxCostOpt = typer.Option(
    None,
    "--max-cost",
    min=0.0,
    help="Stop before an LLM call could make this run spend more than this many USD (llm.max_cost_usd): nothing "
    "is published, exit 5, and the same command with a higher cap resumes without paying again.",
)
EstimateOpt = typer.Option(
    False,
    "--estimate",
    help="Print what the run would spend on LLM calls, per stage (calls, input and expected output tokens, USD; "
    "answers already cached subtracted), and exit: no model is called, the index is not written.",
)
JsonOpt = typer.Option(False, "--json", help="With --estimate: the estimate as JSON.")
QuietOpt = typer.Option(
    False, "--quiet", "-q", help="No progress bars: one line per stage on stderr (its name, what it did, seconds)."
)


def command(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``app.command`` whose failures end as one clear line and the exit code of their kind."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def run(*a: Any, **k: Any) -> Any:
            try:
                return fn(*a, **k)
            except (typer.Exit, click.exceptions.Exit, click.exceptions.Abort, click.ClickException, KeyboardInterrupt):
                raise
            except Exception as exc:  # noqa: BLE001 - the one place every failure is reported
                fail(exc)

        if fn.__doc__ and "help" not in kwargs:  # paragraphs reflowed: a line break inside one is not kept in --help
            kwargs["help"] = re.sub(r"(?<!\n)\n(?!\n)", " ", inspect.cleandoc(fn.__doc__))
        return app.command(*args, **kwargs)(run)

    return register


def fail(exc: BaseException) -> None:
    """Print ``exc`` as one ``error:`` line (an internal error's type too) and exit with its kind's code."""
    code = exit_code(exc)
    text = str(exc).strip() or type(exc).__name__
    if code == EXIT_CODES["internal"]:
        if os.environ.get("STRATA_DEBUG"):
            console.print_exception()
        text = f"{type(exc).__name__}: {text}\n(an internal error: STRATA_DEBUG=1 prints its traceback)"
    error_line(text)
    raise typer.Exit(code)


def error_line(text: str) -> None:
    """``text`` after ``error:`` on stderr."""
    console.print(f"[bold red]error:[/] {escape(text)}", highlight=False)


def overrides(pairs: list[str] | None) -> dict[str, Any]:
    """``--set`` pairs as nested settings; an LLM key goes to the environment, never into flow parameters."""
    data = parse_overrides(pairs or [])
    key = data.get("llm", {}).pop("api_key", None)
    if key is not None:  # never a flow parameter (Prefect records those): hand it over by environment
        os.environ["STRATA_LLM__API_KEY"] = str(key)
    for name in ("access_key_id", "secret_access_key", "session_token", "options"):  # the store's credentials too
        value = data.get("storage", {}).pop(name, None)
        if value is not None:
            os.environ[f"STRATA_STORAGE__{name.upper()}"] = json.dumps(value) if isinstance(value, dict) else str(value)
    return data


def with_cap(pairs: list[str] | None, max_cost: float | None) -> list[str] | None:
    """``--set`` pairs with ``--max-cost`` as the setting it stands for."""
    return pairs if max_cost is None else [*(pairs or []), f"llm.max_cost_usd={max_cost}"]


def config(path: Path | None, pairs: list[str] | None) -> StrataConfig:
    return load_config(path, overrides(pairs))


def open_catalog(index: str, path: Path | None, pairs: list[str] | None) -> Any:
    """The existing index at ``index`` (never created), its store reached with the ``storage`` settings."""
    from tasks.store.catalog import Catalog

    return Catalog(index, create=False, storage=config(path, pairs).storage)


class RichReporter:
    """Progress bars per stage on stderr."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.ids: dict[str, Any] = {}

    def start(self, stage: str, total: int | None) -> None:
        self.ids[stage] = self.progress.add_task(stage, total=total)

    def advance(self, stage: str, n: int = 1) -> None:
        if stage in self.ids:
            self.progress.advance(self.ids[stage], n)

    def finish(self, stage: str, summary: str = "") -> None:
        if stage in self.ids:
            tid = self.ids[stage]
            task = self.progress.tasks[[t.id for t in self.progress.tasks].index(tid)]
            done = task.total or max(task.completed, 1)
            self.progress.update(
                tid, total=done, completed=done, description=f"{stage}: {summary}" if summary else stage
            )


class _NoRunTracebacks(logging.Filter):
    """Prefect logs a failed flow or task run with its traceback; the command prints the failure as one line,
    so the traceback is dropped (kept with ``STRATA_DEBUG=1``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.exc_info is None or bool(os.environ.get("STRATA_DEBUG"))


def stage_line(line: str) -> None:
    console.print(line, markup=False, highlight=False)


@contextlib.contextmanager
def progress(quiet: bool) -> Iterator[None]:
    """Progress bars per stage on the console (one line per stage with ``--quiet``); Prefect's run loggers
    without tracebacks."""
    from tasks.runtime.progress import LineReporter, use_reporter

    quiet_runs = _NoRunTracebacks()
    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "prefect.task_runs")]
    for logger in loggers:
        logger.addFilter(quiet_runs)
    bars = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=quiet,
    )
    try:
        with bars, use_reporter(LineReporter(stage_line) if quiet else RichReporter(bars)):
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet_runs)


#: list options that also take several values after one flag (``--budgets 1000 4000``)
MULTI_VALUE_OPTIONS = ("--budgets", "-b", "--modes", "-m")


def spread_multi_values(argv: list[str]) -> list[str]:
    """``--budgets 1000 4000`` -> ``--budgets 1000 --budgets 4000`` (typer repeats the flag per value)."""
    spread: list[str] = []
    flag = None
    for arg in argv:
        if arg.startswith("-"):
            flag = arg if arg in MULTI_VALUE_OPTIONS else None
            spread.append(arg)
        elif flag and spread[-1] != flag:
            spread += [flag, arg]
        else:
            spread.append(arg)
    return spread


def exit_on_sigterm() -> None:
    """SIGTERM (a scheduler cancelling the job, ``kill``) ends the command as Ctrl-C does: the run's cleanup runs
    (the writer lock is released, the run is marked failed) and so do the exit handlers, which stop the local
    Prefect server the run started; Python's default would end the process at once and leave that server behind."""
    import signal

    def terminated(signum: int, _frame: Any) -> None:
        console.print("terminated; the previous snapshot is still the published one")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)


def script() -> None:
    """The ``strata`` console script: ``main``, then the exit without the interpreter's teardown of every module
    object (~0.15 s after a query, ~1.2 s after a small update: thousands of modules). What an exit must do still
    runs: the ``atexit`` handlers (Prefect's, the LLM client's loop), logging's flush, stdout's and stderr's; a
    thread that is not a daemon still running (none of the commands leaves one) gets the usual exit instead."""
    import atexit
    import threading

    code: Any = 0
    # a spawned child (``ProcessMapper``) runs the main script again to rebuild ``__main__``: this one would import
    # every command (~0.8 s of the child's start); nothing a child runs is defined in it
    vars(sys.modules["__main__"]).pop("__file__", None)
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if others or not (code is None or isinstance(code, int)):
        sys.exit(code)
    atexit._run_exitfuncs()  # CPython's: the registered handlers, in order, as a normal exit runs them
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)


def main() -> None:  # the CLI, callable in process (tests); ``script`` is the console script
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    exit_on_sigterm()
    try:
        app(args=spread_multi_values(sys.argv[1:]))
    except KeyboardInterrupt:
        console.print("interrupted; the previous snapshot is still the published one")
        sys.exit(130)
