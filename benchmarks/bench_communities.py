"""The communities stage's two engines on an index's published graph (prints figures; not a test).

Reads the relations of an index's latest snapshot (layer 0 and the hierarchy's ``summary_of`` links: the graph the
communities stage runs on), spills them into ``--files`` Parquet files as a build does, then runs the stage's
``communities_on_cluster`` in a fresh process per engine (``leiden``: one task; ``parts``: tasks over parts of
``--part-relations`` relations each, run one after another in that process, so its peak is the largest task's plus
what the run's process holds). Prints per engine: level-0 modularity on the whole graph (Newman's, resolution 1),
its ratio to Leiden's, the communities per level, wall time, the tasks run and the longest one, and the process's
peak RSS during the stage (Linux's high-water mark, reset as the stage starts) over its RSS then.

    .venv/bin/python benchmarks/bench_communities.py --index IDX [--part-relations 20000 100000] [--files 8]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def child(work: str, engine: str, part_relations: str) -> None:
    """One engine over the spilled files in ``work``: the rows' file list, wall and peak RSS, as JSON."""
    import types

    import pyarrow.parquet as pq

    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    from schemas.config import load_config, parse_overrides
    from tasks.methods.graph_parts import communities_on_cluster
    from tasks.runtime.parallel import LocalMapper
    from tasks.store.spill import SpilledTable

    class Counted(LocalMapper):  # the tasks the stage ran, and the longest one
        tasks, longest = 0, 0.0

        def __call__(self, fn, batches, on_done=None, keep=True, **kwargs):
            out = []
            for b in batches:
                t = time.perf_counter()
                out.append(fn(b, **kwargs))
                Counted.tasks, Counted.longest = Counted.tasks + 1, max(Counted.longest, time.perf_counter() - t)
            return out

    meta = json.loads(Path(work, "meta.json").read_text())
    ids = pq.read_table(Path(work, "ids.parquet")).column("id")
    schema = pq.read_schema(meta["files"][0])
    sets = [f"communities.engine={engine}", f"communities.part_relations={part_relations}"]
    ctx = types.SimpleNamespace(
        cfg=load_config(overrides=parse_overrides(sets)),
        mapper=Counted(),
        version=1,
        spill_dir=str(Path(work, f"spill-{engine}-{part_relations}")),
    )
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) from here: the stage's, not the imports'
    before = _status_mb("VmRSS")
    t0 = time.perf_counter()
    out = communities_on_cluster(ctx, ids, SpilledTable(meta["files"], schema, meta["rows"]))
    wall = time.perf_counter() - t0
    res = {"files": out.files, "wall": wall, "before_mb": before, "peak_mb": _status_mb("VmHWM")}
    print("RESULT " + json.dumps(res | {"tasks": Counted.tasks, "longest": Counted.longest}))


def _status_mb(field: str) -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", required=True)
    ap.add_argument("--part-relations", type=int, nargs="+", default=[20_000, 100_000])
    ap.add_argument("--files", type=int, default=8, help="relation files, as a build spills them")
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from flows.cli.common import open_catalog
    from flows.env import apply_offline_defaults

    apply_offline_defaults()
    from tasks.methods.hirag import louvain
    from tasks.methods.hirag.communities import graph_arrays
    from tasks.query.inspect import inspect_data

    cat = open_catalog(args.index, None, None)
    snap = cat.require_snapshot(inspect_data(cat, None, 1)["version"])
    rels = cat.read("relations", snap=snap)
    ids = cat.read("entities", snap=snap, columns=["id"]).column("id")
    work = tempfile.mkdtemp(prefix="bench-communities-")
    step = -(-rels.num_rows // args.files)
    files = []
    for i in range(args.files):
        files.append(str(Path(work, f"relations-{i}.parquet")))
        pq.write_table(rels.slice(i * step, step), files[-1])
    pq.write_table(pa.table({"id": ids}), Path(work, "ids.parquet"))
    Path(work, "meta.json").write_text(json.dumps({"files": files, "rows": rels.num_rows}))

    g = graph_arrays(rels)
    at = {x: i for i, x in enumerate(g.names.to_pylist())}
    src = np.concatenate([g.lo, g.hi]).astype(np.int64)
    dst = np.concatenate([g.hi, g.lo]).astype(np.int64)
    w = np.concatenate([g.weight, g.weight])
    print(f"graph: {len(at):,} nodes, {len(g.lo):,} pairs, {rels.num_rows:,} relations in {args.files} files")
    print(
        f"{'engine':<22} {'modularity':>10} {'ratio':>7} {'wall s':>7} {'tasks':>6} {'longest s':>9} {'peak MB':>8} "
        f"{'over start':>10}  levels"
    )
    base = None
    for engine, part in [("leiden", 0), *(("parts", p) for p in args.part_relations)]:
        proc = subprocess.run(
            [sys.executable, __file__, "--child", work, engine, str(part or 2_000_000)],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"{engine} failed:\n{proc.stderr[-3000:]}")
        res = json.loads(line[len("RESULT ") :])
        rows = pa.concat_tables([pq.read_table(f) for f in res["files"]]).to_pylist()
        labels = np.full(len(at), -1)
        for k, r in enumerate(r for r in rows if r["level"] == 0):
            for e in r["entity_ids"]:
                if e in at:
                    labels[at[e]] = k
        q = louvain.modularity(src, dst, w, labels)
        base = base or q
        levels = dict(sorted(Counter(r["level"] for r in rows).items()))
        name = engine if engine == "leiden" else f"parts of {part:,}"
        print(
            f"{name:<22} {q:>10.4f} {q / base:>7.3f} {res['wall']:>7.1f} {res['tasks']:>6} {res['longest']:>9.2f} "
            f"{res['peak_mb']:>8.0f} "
            f"{res['peak_mb'] - res['before_mb']:>10.0f}  {levels}"
        )


if __name__ == "__main__":
    main()
