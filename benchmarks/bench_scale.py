"""Scale benchmark: offline builds of generated corpora of growing size (prints figures; not a test).

For each size N (documents of ``benchmarks/gen_corpus.py``, about one chunk each) it:

1. generates the corpus (deterministic by seed) into ``WORK/N/corpus/corpus.jsonl``;
2. builds an index in a fresh process under ``/usr/bin/time -v`` (peak RSS as the kernel counts it) with
   the stage functions called directly (``--flow`` adds the same build through the Prefect flow on a local
   Dask cluster and prints the flow/direct wall ratio);
3. appends 1 % more documents to the same file and runs ``update`` in a fresh process: the incremental
   wall time as a share of the full build's.

Prints per stage seconds, chunks/s end to end, peak RSS, table sizes on disk, the growth curve.

``--cluster external`` instead starts a real cluster for each size (``dask scheduler`` and ``--workers``
``dask worker`` processes, each ``--nthreads 1 --memory-limit WORKER_MEMORY`` under its nanny), builds through the
Prefect flow against it (``dask.address``) and prints the run process's peak RSS, each worker's peak RSS and its
restarts (a worker process the nanny started again); the direct in-process build runs at the first size only, as
the baseline of the flow/direct wall ratio. No update runs in this mode.

    .venv/bin/python benchmarks/bench_scale.py --sizes 5000 20000 [--work DIR] [--flow] [--update-without-state] [--json OUT]
    .venv/bin/python benchmarks/bench_scale.py --sizes 20000 100000 --cluster external --workers 2 \
        --worker-memory 3GiB --json OUT
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def child(mode: str, corpus: str, index: str) -> None:
    sys.path.insert(0, str(REPO))
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    from flows.pipeline import build_index, update_index
    from schemas.config import load_config
    from tasks.runtime.stages import Stages
    from tasks.store.catalog import Catalog

    began, stage_call = [], Stages.__call__  # when each stage began, to place the parent's memory samples

    def noted(self, name, total=None):
        began.append((name, time.time()))
        return stage_call(self, name, total)

    Stages.__call__ = noted
    t0 = time.perf_counter()
    if mode == "flow":
        from flows.index_flow import index_flow

        out = index_flow(corpus, index)
        result = {"stages": out["stages"], "counts": out["counts"]}
    else:
        if mode == "update-mentions":  # the baseline of ``--update-without-state``: every touched key from its mentions
            from tasks.index import delta

            recompute = delta.recompute_layer0
            delta.recompute_layer0 = lambda *a, grown=None: recompute(*a[:6])  # type: ignore[assignment]
        run = build_index if mode == "direct" else update_index
        res = run(corpus, Catalog(index), load_config())
        result = {"stages": res.stages, "counts": res.counts}
    result["wall_s"], result["began"] = time.perf_counter() - t0, began
    print("RESULT " + json.dumps(result, default=str))


def timed(mode: str, corpus: Path, index: Path, cluster: ExternalCluster | None = None) -> dict:
    # the corpus is one JSONL file (72 MB at 100k documents): past the default per-file cap that guards against
    # stray binaries, so the benchmark raises it
    env = dict(os.environ, PREFECT_HOME=str(index.parent / "prefect"), STRATA_CORPUS__MAX_FILE_BYTES=str(2**31))
    if cluster is not None:
        env["STRATA_DASK__ADDRESS"] = cluster.address
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            ["/usr/bin/time", "-v", sys.executable, __file__, "--child", mode, str(corpus), str(index)],
            stdout=out,
            stderr=err,
            text=True,
            env=env,
            cwd=REPO,
        )
        samples, tree_peak, at_peak = [], 0.0, {}
        while proc.poll() is None:  # /usr/bin/time gives the largest process's peak; Dask workers, the embedding
            parts = tree_rss_mb(proc.pid)  # model's child and the Prefect server are processes of their own
            now = sum(parts.values())
            samples.append((time.time(), now))
            if now > tree_peak:
                tree_peak, at_peak = now, parts
            if cluster is not None:
                cluster.sample()
            time.sleep(0.5)
        out.seek(0)
        err.seek(0)
        proc.stdout, proc.stderr = out.read(), err.read()
    outer = time.perf_counter() - t0
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        sys.exit(f"{mode} run on {corpus} failed:\n{proc.stderr[-4000:]}")
    res = json.loads(line[len("RESULT ") :])
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    res["peak_rss_mb"] = int(rss.group(1)) / 1024 if rss else float("nan")
    res["tree_peak_rss_mb"] = tree_peak
    res["tree_peak_parts_mb"] = {k: round(v) for k, v in at_peak.items() if v >= 1}
    began = res.pop("began")
    res["tree_peak_by_stage_mb"] = peaks_by_stage(samples, began)
    res["process_wall_s"] = outer
    # a successful run logs no errors: neither its own, nor Prefect's, nor Dask's (lost workers, heartbeats)
    res["error_lines"] = [l for l in (proc.stdout + proc.stderr).splitlines() if "ERROR" in l or "Traceback" in l]
    if cluster is not None:
        res["workers"] = cluster.figures(began)
    return res


class ExternalCluster:
    """A scheduler and ``n`` workers started as the commands a team would run (``dask scheduler``, ``dask worker
    ADDRESS --nthreads 1 --memory-limit M``), each worker under its nanny; ``sample()`` records every worker
    process's RSS and pid (a new pid under the same nanny is a restart)."""

    def __init__(self, n: int, memory: str, logs: Path):
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{port}"
        dask = str(Path(sys.executable).parent / "dask")
        env = dict(os.environ, PYTHONPATH=str(REPO))
        logs.mkdir(parents=True, exist_ok=True)
        self.logs = logs
        self.procs = [
            subprocess.Popen(
                [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=(logs / "scheduler.log").open("w"),
            )
        ]
        self.nannies = [
            subprocess.Popen(
                [
                    dask,
                    "worker",
                    self.address,
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    memory,
                    "--no-dashboard",
                    "--host",
                    "127.0.0.1",
                ],
                env=env,
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=(logs / f"worker-{i}.log").open("w"),
            )
            for i in range(n)
        ]
        from distributed import Client

        with Client(self.address, timeout="60s") as client:
            client.wait_for_workers(n, timeout=180)
        self.reset()

    def reset(self) -> None:
        self.peak = [0.0] * len(self.nannies)
        self.pids: list[set[int]] = [set() for _ in self.nannies]
        self.samples: list[tuple[float, float]] = []  # (time, the largest worker's RSS)

    def sample(self) -> None:
        largest = 0.0
        for i, nanny in enumerate(self.nannies):
            for pid in _children(nanny.pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"spawn_main" not in cmdline:  # the nanny's multiprocessing resource tracker
                    continue
                self.pids[i].add(pid)
                rss = sum(tree_rss_mb(pid).values())
                self.peak[i], largest = max(self.peak[i], rss), max(largest, rss)
        self.samples.append((time.time(), largest))

    def figures(self, began: list[tuple[str, float]]) -> dict:
        """Each worker's peak RSS and restarts, the largest worker's peak in each stage, the logs' error lines."""
        out = {
            "peak_rss_mb": [round(p) for p in self.peak],
            "peak_by_stage_mb": peaks_by_stage(self.samples, began),
            "restarts": [max(0, len(p) - 1) for p in self.pids],
            "error_lines": [
                line
                for log in sorted(self.logs.glob("*.log"))
                for line in log.read_text(errors="replace").splitlines()
                if "ERROR" in line or "Traceback" in line
            ],
        }
        self.reset()
        return out

    def close(self) -> None:
        for group in (self.nannies, self.procs):  # the workers first: a scheduler gone first makes them log errors
            for p in group:
                p.terminate()
            for p in group:
                p.wait(timeout=60)


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            out += [int(c) for c in (task / "children").read_text().split()]
    except OSError:
        pass
    return out


def tree_rss_mb(pid: int) -> dict[str, float]:
    """Resident memory of a process and each of its descendants now, in MB, by role (sampled every 0.5 s: a spike
    shorter than that can be missed, so the per-process peak of /usr/bin/time is reported beside it)."""
    parts: dict[str, float] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm", encoding="ascii") as fh:
                pages = int(fh.read().split()[1])
            role = process_role(Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            parts[role] = parts.get(role, 0.0) + pages * os.sysconf("SC_PAGE_SIZE") / 2**20
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return parts


def process_role(cmdline: str) -> str:
    """What a process of the benchmark's tree is: the run, a one-off child (``in_child_process``), a spawned child
    (the embedding model's ``ProcessMapper``, a Dask worker), the Prefect server."""
    for marker, role in (
        ("/usr/bin/time", "time"),
        ("--child", "run"),
        ("_child_main", "one-off child"),
        ("spawn_main", "spawned"),
        ("prefect", "prefect"),
    ):
        if marker in cmdline:
            return role
    return "other"


def peaks_by_stage(samples: list[tuple[float, float]], began: list[tuple[str, float]]) -> dict[str, float]:
    """The largest sampled sum of all processes in each stage: from the time it began to the time the next began
    (before the first: ``start-up``; the last one's runs to the end of the process)."""
    out: dict[str, float] = {}
    for when, mb in samples:
        name = next((n for n, t in reversed(began) if t <= when), "start-up")
        out[name] = round(max(out.get(name, 0.0), mb))
    return out


def disk_mb(path: Path) -> dict[str, float]:
    sizes = {}
    for table in sorted((path / "lance").glob("*.lance")):
        sizes[table.stem] = sum(f.stat().st_size for f in table.rglob("*") if f.is_file()) / 2**20
    return sizes


def one_size(
    n: int, work: Path, seed: int, flow: bool, external: dict | None = None, without_state: bool = False
) -> dict:
    base = work / str(n)
    corpus_dir = base / "corpus"
    corpus = corpus_dir / "corpus.jsonl"
    extra = max(1, n // 100)
    if not corpus.exists():
        corpus_dir.mkdir(parents=True, exist_ok=True)
        full = base / "all.jsonl"
        subprocess.run(
            [
                sys.executable,
                str(REPO / "benchmarks" / "gen_corpus.py"),
                str(full),
                "--docs",
                str(n + extra),
                "--seed",
                str(seed),
                "--vocab",
                str(max(200, n // 4)),
            ],
            check=True,
            capture_output=True,
        )
        lines = full.read_text(encoding="utf-8").splitlines(keepends=True)
        corpus.write_text("".join(lines[:n]), encoding="utf-8")
        (base / "delta.jsonl").write_text("".join(lines[n:]), encoding="utf-8")
    base_text = corpus.read_text(encoding="utf-8")
    n_lines = base_text.count("\n")
    if n_lines != n:  # an earlier run appended the delta: back to the base corpus
        corpus.write_text("".join(base_text.splitlines(keepends=True)[:n]), encoding="utf-8")
    index = base / "index"
    shutil.rmtree(index, ignore_errors=True)
    shutil.rmtree(base / "cache", ignore_errors=True)
    if external is not None:
        return one_size_external(n, base, corpus_dir, external)
    print(f"[{n}] building ...", flush=True)
    full = timed("direct", corpus_dir, index)
    full["disk_mb"] = disk_mb(index)
    with corpus.open("a", encoding="utf-8") as fh:
        fh.write((base / "delta.jsonl").read_text(encoding="utf-8"))
    if without_state:
        shutil.copytree(index, base / "index-mentions", dirs_exist_ok=True)
    print(f"[{n}] updating with {extra} documents ...", flush=True)
    upd = timed("update", corpus_dir, index)
    out = {"docs": n, "build": full, "update": upd}
    if without_state:
        print(f"[{n}] the same update on a copy, every touched key from its mentions ...", flush=True)
        out["update_mentions"] = timed("update-mentions", corpus_dir, base / "index-mentions")
        shutil.rmtree(base / "index-mentions", ignore_errors=True)
    corpus.write_text(base_text, encoding="utf-8")
    if flow:
        print(f"[{n}] building through the Prefect flow on a local Dask cluster ...", flush=True)
        flow_index = base / "index-flow"
        shutil.rmtree(flow_index, ignore_errors=True)
        out["flow"] = timed("flow", corpus_dir, flow_index)
        shutil.rmtree(flow_index, ignore_errors=True)
    return out


def one_size_external(n: int, base: Path, corpus_dir: Path, external: dict) -> dict:
    out: dict = {"docs": n, "cluster": "external", "workers": external["workers"], "worker_memory": external["memory"]}
    if external.pop("direct", False):
        print(f"[{n}] building in process (the baseline) ...", flush=True)
        index = base / "index"
        shutil.rmtree(index, ignore_errors=True)
        out["direct"] = timed("direct", corpus_dir, index)
        shutil.rmtree(index, ignore_errors=True)
    print(
        f"[{n}] building through the Prefect flow on an external cluster of {external['workers']} workers "
        f"({external['memory']} each) ...",
        flush=True,
    )
    cluster = ExternalCluster(external["workers"], external["memory"], base / "cluster-logs")
    try:
        index = base / "index-external"
        shutil.rmtree(index, ignore_errors=True)
        out["build"] = timed("flow", corpus_dir, index, cluster)
        out["build"]["disk_mb"] = disk_mb(index)
        shutil.rmtree(index, ignore_errors=True)
    finally:
        cluster.close()
    return out


def report_external(r: dict) -> None:
    b = r["build"]
    print(
        f"\n== {r['docs']} documents, {b['counts']['chunks']} chunks, {b['counts']['entities']} entities; "
        f"external cluster of {r['workers']} workers, {r['worker_memory']} each"
    )
    print("stages: " + ", ".join(f"{k} {v['seconds']:.1f} s" for k, v in b["stages"].items()))
    print(
        f"flow wall {b['wall_s']:.1f} s; the run process's peak RSS {b['peak_rss_mb']:.0f} MB (its tree with the "
        f"Prefect server: {b.get('tree_peak_rss_mb', 0):.0f} MB); workers' peak RSS "
        f"{', '.join(f'{m} MB' for m in b['workers']['peak_rss_mb'])}; restarts {sum(b['workers']['restarts'])}; "
        f"ERROR or Traceback lines: run {len(b['error_lines'])}, cluster {len(b['workers']['error_lines'])}"
    )
    print("the largest worker by stage: " + ", ".join(f"{k} {v} MB" for k, v in b["workers"]["peak_by_stage_mb"].items()))
    if "direct" in r:
        d = r["direct"]
        print(
            f"direct in process: wall {d['wall_s']:.1f} s, peak RSS {d['peak_rss_mb']:.0f} MB; "
            f"flow on the external cluster / direct = {b['wall_s'] / d['wall_s']:.2f}"
        )


def report(results: list[dict]) -> None:
    for r in results:
        if r.get("cluster") == "external":
            report_external(r)
            continue
        b, u = r["build"], r["update"]
        chunks = b["counts"]["chunks"]
        print(f"\n== {r['docs']} documents, {chunks} chunks, {b['counts']['entities']} entities")
        print(f"{'stage':<14}{'seconds':>9}{'share':>8}{'RSS after':>11}{'peak so far':>13}{'all processes':>15}")
        total = sum(v["seconds"] for v in b["stages"].values())
        tree = b.get("tree_peak_by_stage_mb", {})
        for stage, v in b["stages"].items():
            print(
                f"{stage:<14}{v['seconds']:>9.1f}{v['seconds'] / total:>8.0%}{v.get('rss_mb', 0):>8.0f} MB"
                f"{v.get('peak_rss_mb', 0):>10.0f} MB{tree.get(stage, 0):>12.0f} MB"
            )
        print(
            f"wall {b['wall_s']:.1f} s in process ({b['process_wall_s']:.1f} s with start-up); "
            f"{chunks / b['wall_s']:.1f} chunks/s; peak RSS {b['peak_rss_mb']:.0f} MB "
            f"(all processes together {b.get('tree_peak_rss_mb', 0):.0f} MB: "
            + ", ".join(f"{k} {v}" for k, v in b.get("tree_peak_parts_mb", {}).items())
            + ")"
        )
        print("tables on disk (MB): " + ", ".join(f"{k} {v:.1f}" for k, v in b["disk_mb"].items()))
        print(
            f"update +1 %: {u['wall_s']:.1f} s = {u['wall_s'] / b['wall_s']:.1%} of the build; "
            f"peak RSS {u['peak_rss_mb']:.0f} MB; stages " + _stage_seconds(u)
        )
        if "update_mentions" in r:
            m = r["update_mentions"]
            print(
                f"the same update from the mentions: {m['wall_s']:.1f} s, peak RSS {m['peak_rss_mb']:.0f} MB; merge "
                f"{u['stages']['merge']['seconds']:.1f} s from the state, {m['stages']['merge']['seconds']:.1f} s from the "
                f"mentions ({m['stages']['merge']['seconds'] / max(u['stages']['merge']['seconds'], 1e-9):.1f}x); stages "
                + _stage_seconds(m)
            )
        if "flow" in r:
            f = r["flow"]
            print(
                f"flow on local Dask: {f['wall_s']:.1f} s, ratio flow/direct {f['wall_s'] / b['wall_s']:.2f}; "
                f"peak RSS {f['peak_rss_mb']:.0f} MB (largest process), {f.get('tree_peak_rss_mb', 0):.0f} MB "
                f"(all processes together: the run, its Dask workers, the Prefect server); stages " + _stage_seconds(f)
            )


def _stage_seconds(run: dict) -> str:
    """A run's stages and their seconds, on one line."""
    return ", ".join(f"{k} {v['seconds']:.1f}" for k, v in run["stages"].items())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[5000, 20000])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "strata-scale")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--flow", action="store_true", help="also build through the Prefect flow on local Dask")
    ap.add_argument(
        "--cluster",
        choices=["local", "external"],
        default="local",
        help="external: build through the flow on a scheduler and workers started as separate commands",
    )
    ap.add_argument("--workers", type=int, default=2, help="workers of the external cluster")
    ap.add_argument("--worker-memory", default="3GiB", help="each external worker's --memory-limit")
    ap.add_argument(
        "--no-baseline",
        action="store_true",
        help="external cluster: skip the direct in-process build at the first size",
    )
    ap.add_argument(
        "--update-without-state",
        action="store_true",
        help="also run the same update on a copy with every touched key recomputed from its mentions (the baseline "
        "of the description state, merge_state)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = []
    external = (
        {"workers": args.workers, "memory": args.worker_memory, "direct": not args.no_baseline}
        if args.cluster == "external"
        else None
    )
    for n in args.sizes:
        results.append(one_size(n, args.work, args.seed, args.flow, external, args.update_without_state))
        report(results[-1:])
        if args.json:
            args.json.write_text(json.dumps(results, indent=2, default=str))
    if external is not None:
        first, last = results[0]["build"], results[-1]["build"]
        print(
            f"\nthe run process's peak: {first['peak_rss_mb']:.0f} MB at {first['counts']['chunks']} chunks, "
            f"{last['peak_rss_mb']:.0f} MB at {last['counts']['chunks']} chunks "
            f"({last['peak_rss_mb'] / first['peak_rss_mb']:.2f}x)"
        )
    elif len(results) > 1:
        print(
            "\ngrowth: "
            + "; ".join(
                f"{r['build']['counts']['chunks']} chunks: {r['build']['wall_s']:.0f} s, "
                f"{r['build']['peak_rss_mb']:.0f} MB"
                for r in results
            )
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
