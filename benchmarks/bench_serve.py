"""Load test of `strata serve` on 127.0.0.1 (prints figures; not a test).

Starts ``strata serve`` on a free local port over ``--index``, waits for /readyz, then sends ``--requests``
POST /query requests (the dataset's questions in turn, ``--mode``, ``--budget`` tokens, the offline answer) from
``--clients`` clients at once, once per number given. Clients do not retry: a 503 is a failure like any other non-200
(``--retry``: a 503 is retried after a tenth of its Retry-After and counted instead). With ``--publish-during CORPUS`` (the folder the index was built from), two documents
are added to it one after the other and ``strata update`` publishes each while the last run is under way (it
goes on past ``--requests`` until both are published, or ``--publish-timeout`` seconds have passed): every response
must name one of the published versions, and the versions must change during the run.

    .venv/bin/python benchmarks/bench_serve.py --index ./musique-index --dataset ../shared/datasets/musique \\
        [--requests 2000] [--clients 16 --clients 64] [--mode hi] [--budget 4000] [--publish-during CORPUS] \\
        [--set serve.workers=2]

With ``--hostile`` it sends what a hostile or broken client sends instead — oversize chunked bodies, bodies that
stop arriving (slow loris, past ``serve.body_timeout_s``), heads that never end, invalid UTF-8, deeply nested
JSON, and 1,000 connections opened at once and dropped — then checks that the service is up, that its memory is
within 20 % of its figure before the attack, and that a normal question right after is answered:

    .venv/bin/python benchmarks/bench_serve.py --index ./index --hostile
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np

STRATA = Path(sys.executable).parent / "strata"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load(base: str, questions: list[str], n: int, concurrency: int, until=None, retry: bool = False,
               body: dict | None = None) -> dict:
    """``n`` requests by ``concurrency`` clients (and on, while ``until()`` is false)."""
    latencies, versions, failures = [], Counter(), []
    state = {"sent": 0, "retries": 0}
    statuses: Counter = Counter()

    async def worker(client: httpx.AsyncClient) -> None:
        while state["sent"] < n or (until is not None and not until()):
            i = state["sent"]
            state["sent"] += 1
            t0 = time.perf_counter()
            while True:
                res = await client.post(f"{base}/query", json={"question": questions[i % len(questions)], **(body or {})})
                if res.status_code != 503 or not retry:
                    break
                state["retries"] += 1
                await asyncio.sleep(float(res.headers.get("Retry-After", "1")) / 10)
            statuses[res.status_code] += 1
            if res.status_code == 200:
                latencies.append(time.perf_counter() - t0)
                versions[res.json()["version"]] += 1
            else:
                failures.append(f"{res.status_code} {res.text[:200]}")

    t0 = time.perf_counter()
    async with httpx.AsyncClient(timeout=120) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ms = np.asarray(latencies or [0.0]) * 1000
    return {"clients": concurrency, "requests": state["sent"], "wall_s": round(wall, 1),
            "answered_per_s": round(len(latencies) / wall, 1), "p50_ms": round(float(np.percentile(ms, 50)), 1),
            "p99_ms": round(float(np.percentile(ms, 99)), 1), "failures": len(failures),
            "status": dict(sorted(statuses.items())), "retried_503": state["retries"],
            "versions": dict(sorted(versions.items())), "first_failures": failures[:3]}


def publish_twice(corpus: Path, index: str, env: dict[str, str], published: list[int], running: list) -> None:
    """Two documents added to ``corpus``, one ``strata update`` each (the one running is ``running[-1]``, so that
    ``--publish-timeout`` can stop it); the versions published go to ``published``."""
    for i in range(2):
        time.sleep(5)
        (corpus / f"bench-serve-{i}.txt").write_text(
            f"Bench note {i}: Ada Lovelace wrote the first published algorithm for Babbage's engine.\n", encoding="utf-8")
        running.append(subprocess.Popen([str(STRATA), "update", str(corpus), "--index", index, "--quiet"], env=env,
                                        stdout=subprocess.DEVNULL))
        if running[-1].wait() != 0:
            return  # stopped at the timeout, or failed: what was published stands
        out = subprocess.run([str(STRATA), "inspect", "--index", index, "--json"], check=True, env=env, capture_output=True,
                             text=True).stdout
        published.append(json.loads(out)["version"])


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _raw(port: int, data: bytes, read_s: float) -> bytes:
    """Open a connection, send ``data`` (nothing more), read what comes back within ``read_s`` seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.read(4096), read_s)
        except (TimeoutError, ConnectionError):
            return b""
    except ConnectionError:
        return b""
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def hostile(port: int, body_timeout_s: float) -> dict:
    """Each kind of hostile request, and how the service answered it (status line counts)."""
    head = b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    chunk = b"%x\r\n" % 1_048_576 + b"x" * 1_048_576 + b"\r\n"
    kinds = {
        "chunked 20 MB bodies": (20, head + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 2, 10),
        "declared 20 MB bodies": (20, head + b"Content-Length: 20000000\r\n\r\n" + b"x" * 65536, 10),
        "slow-loris bodies": (200, head + b"Content-Length: 1000\r\n\r\n{\"question\": \"", body_timeout_s + 5),
        "heads that never end": (200, b"POST /query HTTP/1.1\r\nHost: x\r\nX-Slow: ", 3),
        "invalid UTF-8": (100, head + b"Content-Length: 18\r\n\r\n{\"question\": \"\xff\xfe\"}", 10),
        "nested JSON": (50, head + b"Content-Length: 60000\r\n\r\n" + b"[" * 60000, 10),
        "opened and dropped": (1000, b"", 0.01),
    }
    results = {}
    for name, (n, data, read_s) in kinds.items():
        t0 = time.perf_counter()
        replies = await asyncio.gather(*(_raw(port, data, read_s) for _ in range(n)), return_exceptions=True)
        statuses = Counter((r.split(b"\r\n", 1)[0].decode(errors="replace")[9:12] or "no reply") if isinstance(r, bytes)
                           else type(r).__name__ for r in replies)
        results[name] = {"connections": n, "answers": dict(statuses), "seconds": round(time.perf_counter() - t0, 1)}
    return results


def run_hostile(base: str, port: int, pid: int, body_timeout_s: float) -> dict:
    question = {"question": "Who was Scrooge's clerk?"}
    assert httpx.post(f"{base}/query", json=question, timeout=60).status_code == 200  # the view and model warm
    idle = rss_mb(pid)
    attack = asyncio.run(hostile(port, body_timeout_s))
    time.sleep(1)
    after = rss_mb(pid)
    res = httpx.post(f"{base}/query", json=question, timeout=60)
    return {"idle_rss_mb": round(idle, 1), "rss_after_mb": round(after, 1), "rss_ratio": round(after / idle, 3),
            "memory_within_20pct": after <= idle * 1.2, "normal_query_after": res.status_code,
            "up": httpx.get(f"{base}/healthz", timeout=10).status_code == 200, "attack": attack}


def open_sockets(pid: int) -> int:
    """Sockets the process holds now (its file descriptors that are sockets)."""
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


async def held(base: str, port: int, pid: int, n_heads: int, n_idle: int, seconds: float) -> dict:
    """``n_heads`` connections whose head never ends (a byte a second) and ``n_idle`` kept-alive ones left idle after
    one answer, all opened at once and held for ``seconds``; meanwhile one client asks questions on its own kept-alive
    connection. Its latency against the same client's before the attack; the service's sockets, sampled."""
    question = {"question": "Who was Scrooge's clerk?"}

    async def ask(client: httpx.AsyncClient, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            assert (await client.post(f"{base}/query", json=question, timeout=60)).status_code == 200
            out.append((time.perf_counter() - t0) * 1000)
        return out

    closed = Counter()

    async def endless() -> None:
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /query HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            while True:
                try:
                    if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                        break
                except TimeoutError:  # nothing back yet: one more byte of the head
                    writer.write(b"a")
                    await writer.drain()
        closed["head: closed by the service"] += 1

    async def idle() -> None:
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            while await reader.read(4096):  # the answer, then nothing until the service closes it
                pass
        closed["idle: closed by the service"] += 1

    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
        await ask(client, 5)
        before = await ask(client, 40)
        sockets_before = open_sockets(pid)
        attack = [asyncio.create_task(endless()) for _ in range(n_heads)]
        attack += [asyncio.create_task(idle()) for _ in range(n_idle)]
        during: list[float] = []
        peak = 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            during += await ask(client, 5)
            peak = max(peak, open_sockets(pid))
        await asyncio.wait(attack, timeout=30)
        for t in attack:
            t.cancel()
        sockets_after = open_sockets(pid)

    def p(xs: list[float], q: float) -> float:
        return round(sorted(xs)[min(len(xs) - 1, int(q * len(xs)))], 1)

    return {"p50_ms_before": p(before, 0.5), "p99_ms_before": p(before, 0.99), "queries_during": len(during),
            "p50_ms_during": p(during, 0.5), "p99_ms_during": p(during, 0.99),
            "p99_ratio": round(p(during, 0.99) / p(before, 0.99), 2), "service_sockets_before": sockets_before,
            "service_sockets_peak": peak, "service_sockets_after": sockets_after, "attackers": dict(closed)}


def run_held(base: str, port: int, pid: int, n: int, seconds: float) -> dict:
    idle_rss = rss_mb(pid)
    out = asyncio.run(held(base, port, pid, n, n, seconds))
    metrics = httpx.get(f"{base}/metrics", timeout=10).text
    closed = {line.split("{")[1].split("}")[0]: float(line.rsplit(" ", 1)[1])
              for line in metrics.splitlines() if line.startswith("strata_connections_closed_total{")}
    return {**out, "rss_mb_before": round(idle_rss, 1), "rss_mb_after": round(rss_mb(pid), 1),
            "strata_connections_closed_total": closed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--dataset", help="a folder with queries.jsonl (default: a few fixed questions)")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", "--concurrency", type=int, action="append", help="repeatable (default 16 and 64)")
    ap.add_argument("--mode", default="hi")
    ap.add_argument("--budget", type=int, default=4000)
    ap.add_argument("--retry", action="store_true", help="retry a 503 after a tenth of its Retry-After")
    ap.add_argument("--set", action="append", default=[], help="a setting for strata serve, e.g. serve.workers=2")
    ap.add_argument("--publish-during", type=Path, help="the index's corpus folder: two updates publish during the last run")
    ap.add_argument("--publish-timeout", type=float, default=1800.0,
                    help="seconds the last run waits for the two publishes; past them it stops the update still running "
                         "and prints its figures with publish_timed_out (default 1800)")
    ap.add_argument("--hostile", action="store_true", help="hostile and broken requests instead of questions")
    ap.add_argument("--held", type=int, metavar="N",
                    help="N endless heads and N idle kept-alive connections held while one client asks questions")
    ap.add_argument("--held-seconds", type=float, default=20.0, help="how long --held holds them (default 20)")
    ap.add_argument("--log", type=Path, default=Path("bench-serve.log"), help="the service's stderr (access log)")
    args = ap.parse_args()
    questions = (["Who was Scrooge's clerk?", "What did Marley's ghost warn?", "Who is Tiny Tim?"] if not args.dataset else
                 [json.loads(line)["question"] for line in (Path(args.dataset) / "queries.jsonl").read_text().splitlines()])
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    port = free_port()
    body_timeout_s = 2.0
    log = args.log.open("w")
    server = subprocess.Popen([str(STRATA), "serve", "--index", args.index, "--port", str(port),
                               "--set", f"serve.body_timeout_s={body_timeout_s}", "--set", "serve.auth=none",
                               *(x for kv in args.set for x in ("--set", kv))], env=env,
                              stdout=subprocess.DEVNULL, stderr=log, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if server.poll() is not None:
                raise SystemExit(f"strata serve exited: {args.log.read_text()[-2000:]}")
            time.sleep(0.5)
        if args.hostile:
            print(json.dumps(run_hostile(base, port, server.pid, body_timeout_s), indent=1), flush=True)
            return
        if args.held:
            print(json.dumps(run_held(base, port, server.pid, args.held, args.held_seconds), indent=1), flush=True)
            return
        before = httpx.get(f"{base}/snapshots").json()[0]["version"]
        runs = args.clients or [16, 64]
        for i, c in enumerate(runs):
            published: list[int] = []
            pub = None
            running: list[subprocess.Popen] = []
            if args.publish_during and i == len(runs) - 1:
                pub = threading.Thread(target=publish_twice,
                                       args=(args.publish_during, args.index, env, published, running))
                pub.start()
            deadline = time.monotonic() + args.publish_timeout
            until = (lambda p=pub, d=deadline: not p.is_alive() or time.monotonic() > d) if pub else None
            body = {"mode": args.mode, "token_budget": args.budget}
            result = asyncio.run(load(base, questions, args.requests, c, until, args.retry, body))
            if pub:
                if pub.is_alive():  # the figures so far are printed; the update still running is stopped
                    result["publish_timed_out"] = True
                    for proc in running:
                        proc.terminate()
                pub.join()
                result["published_during"] = published
                result["versions_ok"] = set(result["versions"]) <= {before, *published} and len(result["versions"]) > 1
            print(json.dumps(result), flush=True)
    finally:
        server.terminate()
        server.wait(30)
        log.close()


if __name__ == "__main__":
    main()
