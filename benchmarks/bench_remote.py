"""Cold `strata query` on an index on object storage: seconds, requests and bytes read (prints figures; not a test).

Starts moto's S3 server on 127.0.0.1 behind the byte-counting proxy of ``tests/s3_server.py``, indexes the demo
corpus (``data/``) into ``s3://strata-bench/demo`` and into a local folder with the same settings, then runs
``strata query`` ``--runs`` times as fresh processes against each and prints the median wall time, and for the
remote index the requests and bytes each run read, by table, next to the size of the index.
``--delay-ms`` adds that much to every request (a store farther away than 127.0.0.1: 20-50 ms is typical of S3
from outside its region, under 10 ms from inside).

    .venv/bin/python benchmarks/bench_remote.py [--corpus data] [--runs 3] [--delay-ms 0 --delay-ms 30]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import unquote

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
STRATA = Path(sys.executable).parent / "strata"


def table_of(path: str) -> str:
    """The table a request's path names (``/bucket/demo/lance/entities.lance/...``), or what else it is."""
    path = unquote(path)
    if "list-type=2" in path:
        return "(listings)"
    if ".writer.lock" in path:
        return "(writer lock)"
    part = path.split("/lance/", 1)[-1].split("/", 1)[0]
    return part.removesuffix(".lance") if part.endswith(".lance") else "(other)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", default=str(REPO / "data"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--question", default="Who employed Bob Cratchit and how much did he pay him?")
    ap.add_argument("--delay-ms", type=float, action="append", help="added to every request (repeatable; default 0)")
    args = ap.parse_args()

    from tests.s3_server import s3_server

    tmp = Path(tempfile.mkdtemp(prefix="strata-bench-remote-"))
    env = {**os.environ, "STRATA_HOME": str(tmp / "home"), "PREFECT_HOME": str(tmp / "prefect")}
    for key in [k for k in env if k.startswith("STRATA_") and k != "STRATA_HOME"]:
        env.pop(key)
    try:
        with s3_server() as server:
            env.update(server.env())
            os.environ.update({k: env[k] for k in ("STRATA_HOME", "PREFECT_HOME", *server.env())})
            from flows.env import apply_offline_defaults

            apply_offline_defaults()
            env.update({k: v for k, v in os.environ.items() if k not in env})
            server.create_bucket("strata-bench")
            remote, local = "s3://strata-bench/demo", str(tmp / "local")
            from flows.pipeline import build_index
            from schemas.config import load_config
            from tasks.store.catalog import Catalog

            cfg = load_config()
            for index in (remote, local):
                started = time.perf_counter()
                cat = Catalog(index)
                with cat.writer_lock():
                    build_index(args.corpus, cat, cfg)
                print(f"built {index} in {time.perf_counter() - started:.1f} s")
            objects = server.objects("strata-bench", "demo/")
            size: dict[str, int] = defaultdict(int)
            for key, n in objects.items():
                size[table_of("/strata-bench/" + key)] += n
            total = sum(objects.values())
            print(f"remote index: {len(objects)} objects, {total / 1e6:.2f} MB")

            def query(index: str) -> float:
                started = time.perf_counter()
                res = subprocess.run([str(STRATA), "query", args.question, "--index", index, "--json"], env=env,
                                     capture_output=True, text=True, check=False)
                if res.returncode != 0:
                    raise SystemExit(f"strata query failed ({res.returncode}):\n{res.stderr[-2000:]}")
                return time.perf_counter() - started

            query(local)  # warm the page cache and the model export, as a user's second query would find them
            views = Path(local) / "_cache" / "views"
            first = []
            for _ in range(args.runs):
                shutil.rmtree(views, ignore_errors=True)
                first.append(query(local))
            cached = [query(local) for _ in range(args.runs)]
            print(f"local, first query after a publish (no view on disk): median {statistics.median(first):.2f} s")
            print(f"local, cold query with the view on disk: median {statistics.median(cached):.2f} s")
            for delay in args.delay_ms or [0.0]:
                server.proxy.delay_s = delay / 1000
                walls, reads = [], []
                for _ in range(args.runs):
                    for folder in (tmp / "home" / "cache").glob("*/views"):  # the first query after a publish
                        shutil.rmtree(folder, ignore_errors=True)
                    server.traffic.reset()
                    server.traffic.keep_log = True
                    walls.append(query(remote))
                    reads.append(list(server.traffic.log))
                again, again_reads = [], []
                for _ in range(args.runs):  # the view the first one left in the local cache
                    server.traffic.reset()
                    again.append(query(remote))
                    again_reads.append(list(server.traffic.log))
                server.proxy.delay_s = 0.0
                print(f"remote (+{delay:.0f} ms per request), cold query with the view in the local cache: median "
                      f"{statistics.median(again):.2f} s; {len(again_reads[-1])} requests, "
                      f"{sum(n for *_, n, _h in again_reads[-1]) / 1e6:.3f} MB read")
                last = reads[-1]
                by_table: dict[str, list[int]] = defaultdict(lambda: [0, 0])
                for method, path, _status, n, _headers in last:
                    by_table[table_of(path)][0] += 1
                    by_table[table_of(path)][1] += n
                read = sum(n for *_, n, _h in last)
                print(f"remote (moto on 127.0.0.1, +{delay:.0f} ms per request), first query after a publish: median "
                      f"{statistics.median(walls):.2f} s ({', '.join(f'{w:.2f}' for w in walls)}); "
                      f"{len(last)} requests, {read / 1e6:.2f} MB read of {total / 1e6:.2f} MB stored")
                for name, (n, b) in sorted(by_table.items(), key=lambda kv: -kv[1][1]):
                    print(f"  {name:20s} {n:4d} requests {b / 1e6:8.3f} MB read   (stored: {size.get(name, 0) / 1e6:.3f} MB)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
