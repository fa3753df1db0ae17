"""Cold `strata query`: wall time and peak RSS of whole processes (prints figures; not a test).

Indexes the demo corpus (`data/`) into a temporary folder unless ``--index`` names one, then runs
``strata query`` ``--runs`` times as fresh processes under ``/usr/bin/time -v`` and prints each run and the
median: what a user waits for one question from a shell, once for the first query after a publish (no view on
disk) and once for the queries after it (the view that first query left under ``<index>/_cache/views``). ``--import-profile`` adds the slowest imports of
one run (``python -X importtime``).

    .venv/bin/python benchmarks/bench_query.py [--index DIR] [--runs 5] [--question "..."] [--import-profile]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STRATA = Path(sys.executable).parent / "strata"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one process."""
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-2000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", res.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr)
    seconds = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
    return seconds, int(rss.group(1)) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", help="an index to query (default: the demo corpus indexed into a temporary folder)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--question", default="Who employed Bob Cratchit and how much did he pay him?")
    ap.add_argument("--import-profile", action="store_true")
    args = ap.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        index = args.index
        if index is None:
            index = str(Path(tmp) / "index")
            print(f"indexing {REPO / 'data'} into {index} ...", flush=True)
            subprocess.run([str(STRATA), "index", str(REPO / "data"), "--index", index, "--quiet"], check=True, env=env,
                           stdout=subprocess.DEVNULL)
        cmd = [str(STRATA), "query", args.question, "--index", index]
        # the first query after a publish loads the tables and leaves the view on disk; the next ones read it
        first = []
        for _ in range(args.runs):
            shutil.rmtree(Path(index) / "_cache" / "views", ignore_errors=True)
            first.append(timed(cmd, env))
        runs = [timed(cmd, env) for _ in range(args.runs)]
        for label, measured in (("first query after a publish (no view on disk)", first),
                                ("cold strata query, view on disk", runs)):
            for i, (wall, rss) in enumerate(measured, 1):
                print(f"  run {i}: {wall:.2f} s wall, peak RSS {rss:.0f} MB")
            print(f"{label}, median of {len(measured)}: {statistics.median(w for w, _ in measured):.2f} s wall, "
                  f"peak RSS {statistics.median(r for _, r in measured):.0f} MB")
        if args.import_profile:
            res = subprocess.run([sys.executable, "-X", "importtime", "-m", "flows.cli", "query", args.question, "--index",
                                  index], capture_output=True, text=True, env=env, cwd=REPO)
            rows = [line.split("|") for line in res.stderr.splitlines() if line.startswith("import time:")]
            top = sorted(((int(r[1]), r[2].rstrip()) for r in rows[1:] if r[1].strip().isdigit()), reverse=True)[:12]
            print("slowest imports (cumulative ms):")
            for us, name in top:
                print(f"  {us / 1000:8.1f}  {name}")


if __name__ == "__main__":
    main()
