"""Small jobs: what `strata index`, a one-file `strata update`, a CLI `strata query` and `strata validate` cost on a
five-file corpus (and, with ``--demo``, on the demo corpus data/), wall time and peak RSS of the command's process
tree, for this checkout and for a base commit in the same run.

    python benchmarks/bench_small.py --base 58b44b7 [--demo] [--work /tmp/bench-small]

The base commit is checked out as a git worktree (``--base-tree``, created when missing) and its CLI runs with
PYTHONPATH pointing there and this virtualenv (same packages, the base's code). A step that fails prints
"failed: exit N"; after a failed build the steps run on the other code's build of the same corpus (marked †), or
print "skipped"; the benchmark goes on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
QUESTION = "Who founded Firm 1?"
DEMO_QUESTION = "Who employed Bob Cratchit?"
CLI = "import sys; import flows.cli as c; sys.argv[0] = 'strata'; sys.exit(getattr(c, 'script', c.main)())"


def five_files(root: Path) -> Path:
    """Five short Markdown files, each naming two firms, two people and two cities."""
    root.mkdir(parents=True, exist_ok=True)
    for i in range(1, 6):
        (root / f"note_{i}.md").write_text(
            f"# Note {i}\n\nFirm {i} was founded by Person {i} in Oslo. It supplies sensors to Firm {i + 1}, whose "
            f"chief engineer is Person {i + 1}. In 2019 Firm {i} opened an office in Bergen.\n",
            encoding="utf-8",
        )
    return root


def measure(argv: list[str], code: Path, log: Path, model_cache: Path | None) -> tuple[float, float, int]:
    """Run the CLI of ``code`` with ``argv``: (wall seconds, peak RSS of its process tree in MB, exit code)."""
    env = dict(os.environ, PYTHONPATH=str(code), COLUMNS="120")
    if model_cache is not None:  # a machine that has no ONNX export of the embedding model yet
        env["STRATA_MODEL_CACHE"] = str(model_cache)
    env.pop("PREFECT_API_URL", None)
    started = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ strata {' '.join(argv)}\n")
        out.flush()
        # run from the log's folder: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH
        proc = subprocess.Popen(
            [sys.executable, "-c", CLI, *argv], env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent
        )
        peak = 0
        watched = psutil.Process(proc.pid)
        while proc.poll() is None:
            peak = max(peak, _tree_rss(watched))
            time.sleep(0.05)
    return time.perf_counter() - started, peak / 2**20, proc.returncode


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def run_steps(
    name: str,
    corpus: Path,
    changed: str,
    question: str,
    code: Path,
    work: Path,
    cold: bool,
    fallback: Path,
    queries: int = 1,
) -> dict[str, str]:
    """index, the first query after the build and a later one, a one-file update, validate: one cell each. Each code
    indexes the same copy of the corpus at the same place (document ids hash their root). A build that fails leaves
    the later steps on ``fallback`` (another code's fresh build of it), marked "†", when there is one."""
    here = work / name
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir(parents=True)
    docs = work / f"{name.split('-')[0]}-corpus"
    shutil.rmtree(docs, ignore_errors=True)
    shutil.copytree(corpus, docs)
    index, log = here / "index", here / "log.txt"
    cells: dict[str, str] = {}
    mark = ""

    def step(label: str, argv: list[str]) -> bool:
        wall, peak, rc = measure(argv, code, log, here / "model-cache" if cold else None)
        cells[label] = (f"{wall:.1f} s, {peak:.0f} MB" if rc == 0 else f"failed: exit {rc} ({wall:.1f} s)") + mark
        print(f"  {name:>14} {label:<12} {cells[label]}", flush=True)
        return rc == 0

    if step("index", ["index", str(docs), "--index", str(index)]):
        if not fallback.exists():
            shutil.copytree(index, fallback)
    elif fallback.exists():
        shutil.rmtree(index, ignore_errors=True)
        shutil.copytree(fallback, index)
        mark = " †"
    else:
        return cells | {k: "skipped (no index)" for k in ("query first", "query later", "update", "validate")}
    step("query first", ["query", question, "--index", str(index)])
    cache = here / "model-cache" if cold else None
    later = [measure(["query", question, "--index", str(index)], code, log, cache) for _ in range(queries)]
    walls = sorted(w for w, _, rc in later if rc == 0)
    if len(walls) == len(later):  # the median of ``queries`` later queries: one is noise on a shared machine
        cells["query later"] = f"{walls[len(walls) // 2]:.1f} s, {max(p for _, p, _ in later):.0f} MB" + mark
        if queries > 1:
            cells["query later"] += f" (median of {queries}: {' '.join(f'{w:.1f}' for w in walls)})"
    else:
        cells["query later"] = f"failed: exit {max(rc for *_, rc in later)}" + mark
    print(f"  {name:>14} {'query later':<12} {cells['query later']}", flush=True)
    with (docs / changed).open("a", encoding="utf-8") as fh:  # a file changed or added
        fh.write("\nIn 2021 the company opened a second office in Trondheim.\n")
    step("update", ["update", str(docs), "--index", str(index)])
    step("validate", ["validate", "--index", str(index)])
    return cells


def base_tree(rev: str, tree: Path) -> Path:
    if not (tree / "flows").is_dir():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), rev], check=True)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare with (e.g. the one before a change)")
    ap.add_argument("--base-tree", type=Path, default=Path("/tmp/strata-base"), help="its git worktree")
    ap.add_argument("--demo", action="store_true", help="also the demo corpus data/ (minutes on two cores)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-small"))
    ap.add_argument("--cold", action="store_true", help="each code on a model cache of its own, empty at the start")
    ap.add_argument("--queries", type=int, default=1, help="later queries per corpus and code (their median)")
    ap.add_argument("--interleave", type=int, default=0, help="then this many rounds of the query, codes alternating")
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    versions = {f"this ({head.stdout.strip()}+)": REPO, f"base {args.base}": base_tree(args.base, args.base_tree)}
    corpora = [("five files", five_files(args.work / "five"), "note_1.md", QUESTION)]
    if args.demo:
        # data/README.md is left out by data/.strataignore: the demo's one-file update adds a file
        corpora.append(("demo (data/)", REPO / "data", "fezziwig.md", DEMO_QUESTION))
    print(f"{psutil.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
    table: dict[tuple[str, str], dict[str, str]] = {}
    for corpus_name, corpus, changed, question in corpora:
        fallback = args.work / f"{corpus_name.split()[0]}-built"
        shutil.rmtree(fallback, ignore_errors=True)
        for version, code in versions.items():
            slug = f"{corpus_name.split()[0]}-{'base' if code != REPO else 'this'}"
            table[(corpus_name, version)] = run_steps(
                slug, corpus, changed, question, code, args.work, args.cold, fallback, args.queries
            )
    labels = ["index", "update", "query first", "query later", "validate"]
    print("\n| corpus | code | " + " | ".join(labels) + " |")
    print("|---|---|" + "---:|" * len(labels))
    for (corpus_name, version), cells in table.items():
        print(f"| {corpus_name} | {version} | " + " | ".join(cells.get(k, "") for k in labels) + " |")
    print("\n† on the index the other code built (this code's build failed)")
    if args.interleave:
        print(
            f"\nCLI query, {args.interleave} rounds alternating the two codes, each on its own index (after its update)"
        )
        for corpus_name, _corpus, _changed, question in corpora:
            name = corpus_name.split()[0]
            runs = {
                v: (code, args.work / f"{name}-{'base' if code != REPO else 'this'}") for v, code in versions.items()
            }
            print(f"  {corpus_name}: {interleaved(runs, question, args.interleave)}", flush=True)


def interleaved(runs: dict[str, tuple[Path, Path]], question: str, rounds: int) -> str:
    """The same query by each code on its own index, the codes alternating ``rounds`` times: the median wall and CPU
    seconds of each, and this code's over the base's (a shared machine's drift falls on both alike)."""
    import resource
    import statistics

    walls: dict[str, list[float]] = {v: [] for v in runs}
    cpus: dict[str, list[float]] = {v: [] for v in runs}
    for _ in range(rounds):
        for version, (code, here) in runs.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall, _peak, rc = measure(["query", question, "--index", str(here / "index")], code, here / "log.txt", None)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if rc == 0:
                walls[version].append(wall)
                cpus[version].append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if not all(walls.values()):
        return "failed"
    this, base = list(runs)
    med = {v: (statistics.median(walls[v]), statistics.median(cpus[v])) for v in runs}
    return (
        ", ".join(f"{v} {w:.2f} s wall / {c:.2f} s CPU" for v, (w, c) in med.items())
        + f"; this / base {med[this][0] / med[base][0]:.2f}× wall, {med[this][1] / med[base][1]:.2f}× CPU"
    )


if __name__ == "__main__":
    main()
