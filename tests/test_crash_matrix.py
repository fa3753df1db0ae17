"""The crash matrix: SIGKILL the CLI (its whole process group) at every stage boundary and in the middle of
extraction, embedding and publish, for ``index``, ``update`` and ``backfill``. After each kill the previous
snapshot still reads exactly as before, and the same command run again publishes tables identical, row by
row, to those of an uninterrupted run (for ``index`` and ``update`` once, after a chain of kills: ``check_chain``).
On the LLM path (a local fake server) the re-run after a kill in the middle of extraction or of the reports pays
again for at most 1 % of the calls the killed run had answered. The kill points come from the stages the
uninterrupted run logged, so a new stage is covered without editing this file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from tasks.store.catalog import Catalog
from tests.conftest import CAROL, REPO, musique_passages
from tests.fake_llm_server import FakeLLM
from tests.test_golden_tables import table_digests

pytestmark = pytest.mark.slow

SETS = ["--set", "chunking.size=200", "--set", "chunking.overlap=20", "--set", "extract.batch_size=2",
        "--set", "embedding.batch_size=8", "--set", "embedding.runtime=onnx", "--set", "dask.processes=false", "--quiet"]
#: stages that must be among those the runs log (the matrix covers all of them, and any added later)
CORE = {"ingest", "chunk", "extract", "merge", "embed", "communities", "reports", "validate", "publish"}
MID = ["during:extract", "during:embed", "during:publish"]


def _write(root: Path, passages: range, carol: slice | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rows = musique_passages(max(passages) + 1)
    for i in passages:
        (root / f"p{i}.txt").write_text(f"# {rows[i]['title']}\n\n{rows[i]['text']}\n", encoding="utf-8")
    if carol:
        text = CAROL.read_text(encoding="utf-8")
        start = text.index("STAVE ONE")
        (root / "carol.txt").write_text(text[start + carol.start : start + carol.stop], encoding="utf-8")
    return root


def content(index: Path) -> dict[str, str]:
    """A digest per table of the published snapshot, over ids and content (not the version a row was
    written in, nor where and when the corpus was read); every id unique."""
    cat = Catalog(index)
    snap = cat.require_snapshot()
    for name in ("documents", "chunks", "mentions", "entities", "relations", "communities", "community_reports",
                 "quarantine"):
        ids = cat.read(name, snap=snap, columns=["id"]).column("id")
        assert len(set(ids.to_pylist())) == len(ids), f"duplicate ids in {name}"
    return table_digests(index, also_drop=("version",))


def strata(*args: str) -> str:
    res = CliRunner().invoke(app, [*args])
    assert res.exit_code == 0, res.output
    return res.output


class Forks:
    """``tests/crash.py --serve``: the CLI's libraries imported once, each kill run in a forked child."""

    def __init__(self, logs: Path):
        self.logs, self.n = logs, 0
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.crash", "--serve"], cwd=REPO, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout

    def kill_at(self, point: str, args: list[str], env: dict[str, str] | None = None) -> str | None:
        """Run the CLI on ``args`` until ``point`` kills it; None, or what went wrong."""
        self.n += 1
        log = self.logs / f"{self.n:03d}.log"
        self.stdin.write(json.dumps({"point": point, "args": args, "env": env, "log": str(log)}) + "\n")
        self.stdin.flush()
        status = json.loads(self.stdout.readline())["status"]
        text = log.read_text(errors="replace")
        if status != -9 or f"KILLED {point}" not in text:
            return f"{point}: not killed there (exit {status}): {text[-2000:]}"
        return None

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    server = Forks(tmp_path_factory.mktemp("crash-logs"))
    yield server
    server.close()


def stages_of_last_run(index: Path) -> list[str]:
    """The stages the last run logged, in order."""
    logged = json.loads(Catalog(index).runs()[-1]["stage_counts"])
    return [s for s in logged if s != "dask-start"]


def published(index: Path) -> dict[str, str] | None:
    return content(index) if Catalog(index).snapshot() else None


def uninterrupted(work: Path, base: Path | None, command: list[str], earlier: list[dict[str, str] | None]):
    """The tables ``command`` publishes run uninterrupted on a copy of ``base`` (None: no index yet), and the stages
    it logged (every one of ``CORE`` among them)."""
    reference = work / "reference"
    if base:
        shutil.copytree(base, reference)
    strata(*command, "--index", str(reference), *SETS)
    expected = content(reference)
    assert expected not in earlier  # the command changes something
    stages = stages_of_last_run(reference)
    assert CORE <= set(stages), stages
    return expected, stages


def killed(forks: Forks, index: Path, point: str, command: list[str], seen: tuple[dict[str, str] | None, ...]):
    """Kill ``command`` at ``point``; None, or what went wrong: not killed there, or readers see a snapshot that is
    not one of ``seen`` (the ones before the command, or its finished one), unchanged."""
    failure = forks.kill_at(point, [*command, "--index", str(index), *SETS])
    if not failure and published(index) not in seen:  # reads every table of the snapshot
        failure = f"{point}: readers see a snapshot that is neither an earlier one nor the finished one"
    return failure


def check_chain(forks: Forks, work: Path, base: Path | None, command: list[str], earlier: list[dict[str, str] | None]):
    """Run ``command`` uninterrupted on a copy of ``base``; then, on one other copy, kill it at every point of the
    stages it logged in turn (each kill on what the kills before it left), check what readers see after each, and
    run it once more to the end: the uninterrupted run's tables.

    A chain, not a re-run after each kill: everything a run writes before its publish commits is its work folder
    (removed when a run starts) and caches (filled again or read back), so a kill leaves nothing that the next run's
    first stages would not also meet — the stages of a killed run are a prefix of the re-run's. One re-run checks
    them all at a fifth of the time; ``after:publish``, past the commit, is the chain's last kill."""
    expected, stages = uninterrupted(work, base, command, earlier)
    index = work / "killed"
    if base:
        shutil.copytree(base, index)
    chain = [f"after:{s}" for s in stages if s != "publish"] + MID + ["after:publish"]
    failures = [f for point in chain if (f := killed(forks, index, point, command, (expected, *earlier)))]
    assert not failures, "\n".join(failures)
    strata(*command, "--index", str(index), *SETS)
    assert content(index) == expected, f"the re-run after kills at {', '.join(chain)} differs from the uninterrupted run"


def check_each(forks: Forks, work: Path, command: list[str], kills: list[str], earlier: list[dict[str, str] | None]):
    """Run ``command`` uninterrupted; then for each of ``kills``, on an index of its own: kill it there, check what
    readers see, run it again: the uninterrupted run's tables."""
    expected, _stages = uninterrupted(work, None, command, earlier)
    failures = []
    for point in kills:
        index = work / point.replace(":", "-").replace("#", "-")
        failure = killed(forks, index, point, command, (expected, *earlier))
        if not failure:
            strata(*command, "--index", str(index), *SETS)
            if content(index) != expected:
                failure = f"{point}: the re-run differs from the uninterrupted run"
        if failure:
            failures.append(failure)
        shutil.rmtree(index)
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    """Ids hash the corpus root, so every run of a case reads the same folders."""
    root = tmp_path_factory.mktemp("crash-corpora")
    first = _write(root / "first", range(0, 5), slice(0, 2500))
    second = _write(root / "second", range(5, 9))
    return {"first": first, "second": second}


def test_index_killed_anywhere_reruns_to_the_uninterrupted_tables(tmp_path, corpora, forks):
    check_chain(forks, tmp_path, None, ["index", str(corpora["first"])], [None])


def test_update_killed_anywhere_reruns_to_the_uninterrupted_tables(tmp_path, corpora, forks):
    corpus = tmp_path / "corpus"
    shutil.copytree(corpora["first"], corpus)
    base = tmp_path / "base"
    strata("index", str(corpus), "--index", str(base), *SETS)
    # tonight's change: one passage edited, one deleted, two added
    (corpus / "p1.txt").write_text((corpus / "p1.txt").read_text() + "\nIt was renamed in 1998.\n")
    (corpus / "p2.txt").unlink()
    _write(corpus, range(9, 11))
    check_chain(forks, tmp_path, base, ["update", str(corpus)], [content(base)])


def test_backfill_killed_between_and_within_partitions_reruns_to_the_uninterrupted_tables(tmp_path, corpora, forks):
    command = ["backfill", str(corpora["first"]), str(corpora["second"])]
    probe = tmp_path / "probe"
    strata(*command[:2], "--index", str(probe), *SETS)
    first = content(probe)  # what readers see once the first partition is published
    shutil.rmtree(probe)
    # a partition is an update of its own root, whose every stage boundary the update matrix covers; here
    # the points a backfill adds: between partitions, and within the first and the second
    kills = ["after:publish", "after:ingest#2", "after:attach", "during:extract#2", "during:embed#2",
             "during:publish#2", "during:extract", "during:publish"]
    check_each(forks, tmp_path, command, kills, [None, first])


@pytest.mark.parametrize("point", ["during:extract", "during:hierarchy"])
def test_llm_calls_answered_before_a_kill_are_not_paid_again(tmp_path, corpora, forks, monkeypatch, point):
    """On the LLM path, a kill in the middle of extraction or of the summaries: the re-run takes at least
    99 % of the answers the killed run received from the cache, and publishes the uninterrupted tables."""
    fake = FakeLLM().start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-fake")
        llm = ["--set", "llm.model=openai/fake", "--set", f"llm.api_base={fake.url}", "--set", "llm.max_concurrency=2"]
        command = ["index", str(corpora["first"]), *llm]
        reference = tmp_path / "reference"
        strata(*command, "--index", str(reference), *SETS)
        expected = content(reference)
        index = tmp_path / "index"
        start = len(fake.answered)
        failure = forks.kill_at(point, [*command, "--index", str(index), *SETS], {"OPENAI_API_KEY": "sk-fake"})
        assert not failure, failure
        paid = set(fake.answered[start:])
        assert paid, "the killed run made no LLM call"
        start = len(fake.answered)
        strata(*command, "--index", str(index), *SETS)
        again = [a for a in fake.answered[start:] if a in paid]
        # at most max_concurrency calls can be in flight when the process dies: answered by the server, never
        # received; every answer received was cached and is not paid again
        assert len(again) <= max(0.01 * len(paid), 2), f"{len(again)} of {len(paid)} answered calls paid again"
        assert content(index) == expected
    finally:
        fake.stop()
