"""Commands that answer questions from an index: ``query``, ``shell``, ``serve``."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape

from flows.cli.common import AsOfOpt, ConfigOpt, ReadIndexOpt, SetOpt, command, config, console, out, overrides
from tasks.errors import RefusedError, UsageError
from tasks.methods.registry import modes_help

if TYPE_CHECKING:
    from schemas.config import ServeConfig

ModeOpt = typer.Option(
    None,
    "--mode",
    help=f"Retrieval mode (default: the index method's first). {modes_help()}; all at the same token budget.",
)
BudgetOpt = typer.Option(None, "--budget", min=100, help="Context token budget (default: retrieval.token_budget).")


@command()
def query(
    question: str = typer.Argument(..., help="The question to answer."),
    index: str = ReadIndexOpt,
    mode: Optional[str] = ModeOpt,
    budget: Optional[int] = BudgetOpt,
    as_of: Optional[int] = AsOfOpt,
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    answer_only: bool = typer.Option(False, "--answer", help="Print the answer alone, without the context."),
) -> None:
    """Retrieve local entities, community reports and bridge paths for a question, then answer it.

    Without an LLM configured the answer is extractive: at most two sentences of the sources (60 words), the one
    closest to the question and the one that best continues it, each with its document; or a plain statement
    that the index holds no answer when no source sentence comes close."""
    from tasks.query.reader import open_reader
    from tasks.retrieval.view import remember_view

    if not question.strip():
        raise UsageError('the question is empty: ask something, e.g. strata query "Who employed Bob Cratchit?"')
    reader = open_reader(index, config(config_path, set_), as_of, mode, alone=True)
    ctx, answer, ms = reader.ask(question, mode, budget)
    remember_view(reader.view)  # the next `strata query` on this snapshot starts from it
    if as_json:
        out.print_json(json.dumps(ctx.as_dict() | {"answer": answer, "retrieval_ms": round(ms, 1)}, default=str))
        return
    if answer_only:
        out.print(answer["text"] or ctx.message or "(no answer)", markup=False, highlight=False, soft_wrap=True)
        return
    out.print(
        f"[bold]Q:[/] {escape(question)}   [dim](mode {ctx.mode}, snapshot v{ctx.version}, {ms:.0f} ms, "
        f"{sum(ctx.tokens.values())} context tokens)[/]"
    )
    if ctx.message:
        out.print(f"[yellow]{escape(ctx.message)}[/]")
    if ctx.seeds:
        out.print(
            f"[dim]graph seeds — named in the question: {escape(', '.join(ctx.seeds.get('named', [])) or '(none)')}; "
            f"nearest to it: {escape(', '.join(ctx.seeds.get('similar', [])) or '(none)')}; "
            f"chained from the best sentences: {escape(', '.join(ctx.seeds.get('chained', [])) or '(none)')}[/]"
        )
    data = ctx.as_dict()
    for title, key in (
        ("Local: entities", "entities"),
        ("Global: community reports", "communities"),
        ("Bridge: reasoning-path triples", "bridge"),
        ("Sources: chunks", "chunks"),
    ):
        if data[key]:
            out.rule(f"{title} ({len(data[key])})")
            for it in data[key]:
                out.print(it["text"], markup=False, highlight=False)
    if answer.get("note"):
        out.print(f"[yellow]{escape(answer['note'])}[/]")
    out.rule(
        "Answer (extractive: the best-matching context sentences, no LLM)"
        if answer["kind"] == "extractive"
        else f"Answer ({reader.client.cfg.model})"
    )
    out.print(answer["text"] or "(no sentence of the context matches the question)", markup=False, highlight=False)


SHELL_HELP = """questions are answered from the published snapshot (a newer one is picked up before each question)
  :mode NAME     retrieval mode (the index's: {modes})
  :budget N      context token budget (at least 100)
  :sources       show or hide the source passages of each answer
  :json          print each answer as the JSON of `strata query --json`, or not
  :help          this text
  :quit          leave (also Ctrl-D)"""


@command()
def shell(
    index: str = ReadIndexOpt,
    mode: Optional[str] = typer.Option(None, help="Starting mode (default: the index method's first)."),
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """An interactive prompt: the snapshot and the embedding model are loaded once, each question is answered in
    well under a second, and a newly published snapshot is picked up without leaving. History in ~/.strata_history."""
    import readline

    from tasks.query.reader import open_reader

    reader = open_reader(index, config(config_path, set_), mode=mode, alone=True)
    reader.embedder.embed(["warm up"])
    history = Path.home() / ".strata_history"
    with contextlib.suppress(OSError):
        readline.read_history_file(history)
    state: dict[str, Any] = {
        "mode": mode or reader.modes[0],
        "budget": reader.cfg.retrieval.token_budget,
        "sources": False,
        "json": False,
    }
    out.print(
        f"snapshot v{reader.view.version} of {reader.catalog.uri} ({reader.view.method}; {len(reader.view.ent_ids)} "
        f"entities, {len(reader.view.chunk_ids)} chunks), mode {state['mode']}, budget {state['budget']}; :help for commands"
    )
    while True:
        try:
            line = input("strata> ").strip()
        except (EOFError, KeyboardInterrupt):
            out.print()
            break
        if not line:
            continue
        if line.startswith(":"):
            if _shell_command(line[1:], state, reader.modes):
                break
            continue
        if reader.refresh():
            out.print(f"[dim]snapshot v{reader.view.version} loaded[/]")
        ctx, result, ms = reader.ask(line, state["mode"], state["budget"])
        if state["json"]:
            print(json.dumps(ctx.as_dict() | {"answer": result, "retrieval_ms": round(ms, 1)}, default=str))
            continue
        label = "extractive" if result["kind"] == "extractive" else reader.client.cfg.model
        out.print(
            f"[bold]answer[/] [dim]({label}; mode {state['mode']}, snapshot v{ctx.version}, {ms:.0f} ms, "
            f"{sum(ctx.tokens.values())} context tokens)[/]"
        )
        out.print(
            result["text"] or ctx.message or "(no sentence of the context matches the question)",
            markup=False,
            highlight=False,
        )
        if state["sources"]:
            for c in ctx.as_dict()["chunks"]:
                out.print(f"  [{c['score']:.3f}] {c['title']}: {c['text'][:160]}", markup=False, highlight=False)
    with contextlib.suppress(OSError):
        readline.write_history_file(history)


def _shell_command(line: str, state: dict[str, Any], modes: tuple[str, ...]) -> bool:
    """One ``:command`` of the shell; True to leave."""
    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    if cmd in ("q", "quit", "exit"):
        return True
    if cmd == "help":
        out.print(SHELL_HELP.format(modes=", ".join(modes)), markup=False, highlight=False)
    elif cmd == "mode" and arg in modes:
        state["mode"] = arg
        out.print(f"mode {arg}")
    elif cmd == "mode":
        console.print(f"[bold red]error:[/] unknown mode {escape(repr(arg))}; this index offers {', '.join(modes)}")
    elif cmd == "budget" and arg.isdigit() and int(arg) >= 100:
        state["budget"] = int(arg)
        out.print(f"budget {arg} tokens")
    elif cmd == "budget":
        console.print(
            f"[bold red]error:[/] the budget must be a whole number of at least 100 tokens, not {escape(repr(arg))}"
        )
    elif cmd in ("sources", "json"):
        state[cmd] = not state[cmd]
        out.print(f"{cmd} {'on' if state[cmd] else 'off'}")
    else:
        console.print(f"[bold red]error:[/] unknown command :{escape(cmd)}; :help lists them")
    return False


@command()
def serve(
    index: str = ReadIndexOpt,
    host: Optional[str] = typer.Option(
        None,
        help="Interface to bind (default serve.host: 127.0.0.1, this machine only; serve.auth = none: loopback only).",
    ),
    port: Optional[int] = typer.Option(None, min=1, max=65535, help="Port, 1-65535 (default serve.port: 8000)."),
    config_path: Optional[Path] = ConfigOpt,
    set_: Optional[list[str]] = SetOpt,
) -> None:
    """An HTTP query service over the published snapshot, safe while updates publish new ones.

    POST /query {question, mode?, token_budget?, as_of?} answers as `strata query --json` does; GET /snapshots,
    /index (inspect --json), /metrics (Prometheus), /healthz, /readyz; API docs at /docs and /redoc (packaged, no
    CDN); a query explorer page at /. A newly published snapshot is found within serve.snapshot_check_s and used,
    without a restart, once the request that found it has loaded it (the others answer from the one before
    meanwhile); each response names its version. One access-log line per request on stderr. Settings under
    \\[serve]: api_key_env and auth (below), workers (processes: one per core), max_concurrency (queries at once
    per worker), queue_size and request_timeout_s (how many wait for a slot, and how long, before a 503 +
    Retry-After), max_budget, max_request_bytes (413), body_timeout_s (408), log_format (text | json),
    log_questions, warm_sentences (the offline answer's source sentences embedded before /readyz says ready).

    Closed by default: every route but /healthz, /readyz, the explorer page, /favicon.ico and the docs needs `Authorization:
    Bearer <key>`. The key: the variable serve.api_key_env names (the service refuses to start when it is unset),
    else a random token made at this start, printed once in the explorer's URL (http://127.0.0.1:8000/?token=...),
    shared by all workers, never logged or written to a file. serve.auth = "none" serves without a key, on a
    loopback interface only (--host 127.0.0.1, ::1 or localhost; elsewhere exit 5). Ctrl-C or SIGTERM stops it."""
    import signal

    import uvicorn

    from flows.serve import api_key, configure_access_log, create_app, refuse_open_network
    from flows.serve_conn import uvicorn_options
    from tasks.store.catalog import Catalog

    cfg = config(config_path, set_)
    host, port = host or cfg.serve.host, port or cfg.serve.port
    refuse_open_network(cfg, host)
    Catalog(index, create=False, storage=cfg.storage).require_snapshot()
    key = api_key(cfg, fresh=True)  # refuses before anything binds; the token made here is the workers' too
    sock = bind(host, port)
    base = f"http://{_url_host(host)}:{sock.getsockname()[1]}"
    if cfg.serve.api_key_env:
        auth = f"bearer key from ${cfg.serve.api_key_env}"
    else:
        auth = "token made at start" if key else "none (serve.auth = none, this machine only)"
    configure_access_log()
    console.print(f"serving {index} on {base}  (docs /docs, explorer /, auth: {auth})", soft_wrap=True)
    if key and not cfg.serve.api_key_env:  # printed once, here alone (the way notebook servers do)
        console.print(f"open the explorer: {base}/?token={key}", soft_wrap=True, highlight=False)
        console.print(f"API calls: -H 'Authorization: Bearer {key}'", soft_wrap=True, highlight=False)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stopped as by Ctrl-C: no writer's message
    try:
        if cfg.serve.workers == 1:
            app = create_app(index, cfg)
            ucfg = uvicorn.Config(app, log_level="warning", access_log=False, **uvicorn_options(cfg.serve))
            server = uvicorn.Server(ucfg)
            server.run(sockets=[sock])
        else:
            serve_workers(index, config_path, overrides(set_), cfg.serve, sock)
    except KeyboardInterrupt:
        pass
    console.print("stopped")


def _url_host(host: str) -> str:
    """``host`` as a URL writes it: an IPv6 address in brackets, the wildcard as this machine's loopback name."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def serve_workers(
    index: str, config_path: Path | None, settings: dict, limits: ServeConfig, sock: socket.socket
) -> None:
    """``limits.workers`` processes of the app on one listening socket (uvicorn's supervisor restarts one that dies),
    their metrics summed through a folder they share (``flows.serve_metrics``)."""
    import shutil
    import tempfile

    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from flows.serve import APP_ENV
    from flows.serve_conn import uvicorn_options

    metrics_dir = tempfile.mkdtemp(prefix="strata-serve-metrics-")
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    os.environ[APP_ENV] = json.dumps(
        {"index": index, "config": str(config_path) if config_path else None, "overrides": settings}
    )
    ucfg = uvicorn.Config(
        "flows.serve:app_from_env",
        factory=True,
        workers=limits.workers,
        log_level="warning",
        access_log=False,
        **uvicorn_options(limits),
    )
    try:
        Multiprocess(ucfg, sockets=[sock]).run()
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``, or a clear refusal (port in use, no such interface) before any
    'serving' line is printed."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"cannot bind to host {host!r}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise RefusedError(
            f"cannot listen on {host}:{port}: {exc.strerror} (is another service on that port? choose "
            "another with --port)"
        ) from None
    sock.set_inheritable(True)
    return sock
