"""The tables a build and an update publish, pinned by digest: a refactor of the orchestration must not
change one id, row, vector or layer statistic. Regenerate (only for an intended change of output) with

    .venv/bin/python -m tests.test_golden_tables --write

The packaged model's vectors differ in their last bits from one CPU to another (PyTorch under bf16 autocast
where bf16 is native, ONNX Runtime's kernels per instruction set), and the GMM layers follow the vectors; so
these cases embed with ``HashingEmbedder``, whose vectors are the same bits everywhere: the digests pin what
the pipeline does with the texts it embeds, on any machine.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pytest

if TYPE_CHECKING:
    import numpy as np

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_digests.json"
#: columns that legitimately differ between two runs: where the corpus lies, when it was read, how long it took
VOLATILE = {"documents": {"uri", "root", "ingested_at"}, "layers": {"seconds"}}
CONFIG = {"chunking": {"size": 200, "overlap": 20}, "extract": {"batch_size": 4}, "dask": {"processes": False}}


def table_digests(index: Path, also_drop: tuple[str, ...] = ()) -> dict[str, str]:
    """A digest per table of the published snapshot, without the ``VOLATILE`` columns and ``also_drop``."""
    from schemas.tables import SNAPSHOT_TABLES
    from tasks.store.catalog import Catalog

    cat = Catalog(index)
    snap = cat.require_snapshot()
    out = {}
    for name in SNAPSHOT_TABLES:
        table = cat.read(name, snap=snap)
        out[name] = digest(table.drop([c for c in {*VOLATILE.get(name, ()), *also_drop} if c in table.column_names]))
    return out


def digest(table: pa.Table) -> str:
    """Rows and digest of ``table``'s rows in their order (not how they lie in fragments: a spilled table writes
    several, nor in what buffers: a take copies each column's values into buffers of their size — a string column
    with nulls read back from Lance may hold bytes past its last value, more or fewer by how it was written)."""
    table = table.take(pa.array(range(table.num_rows), pa.int64())).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return f"{table.num_rows}:{hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]}"


def _corpus(root: Path, step: int) -> Path:
    """Step 1: two book slices, a note and 12 MuSiQue passages; step 2: one slice edited, one file deleted, one added."""
    from tests.conftest import write_small_corpus

    write_small_corpus(root)
    if step == 2:
        (root / "carol_2.txt").unlink()
        with (root / "carol_1.txt").open("a", encoding="utf-8") as fh:
            fh.write("\nScrooge kept a counting-house in the City of London, near Cornhill.\n")
        (root / "notes" / "fezziwig.md").write_text(
            "# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge was apprenticed.\n",
            encoding="utf-8",
        )
    return root


#: document ids hash their corpus root, so the corpus always lies at the same place
CORPUS = Path(tempfile.gettempdir()) / "strata-golden-corpus"


class HashingEmbedder:
    """Feature hashing of a text's lower-cased words into 64 signed dimensions, unit norm: a deterministic,
    CPU-independent stand-in for the packaged model (texts sharing words get similar vectors)."""

    name = cache_name = "test-hashing-64"
    client = None  # no usage to report
    dim = 64

    def embed(self, texts: list[str]) -> np.ndarray:
        import re

        import numpy as np

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            for word in re.findall(r"\w+", text.lower()):
                h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 32) & 1 else -1.0
            norm = np.linalg.norm(out[i])
            out[i] = out[i] / norm if norm else np.eye(self.dim, dtype=np.float32)[0]
        return out


def build_cases(work: Path) -> dict[str, dict[str, str]]:
    from unittest import mock

    from schemas.config import load_config

    with mock.patch("tasks.index.embed.get_embedder", lambda *_a, **_k: HashingEmbedder()):
        return _cases(work, load_config(overrides=CONFIG))


def _cases(work: Path, cfg) -> dict[str, dict[str, str]]:
    from flows.pipeline import build_index, update_index
    from tasks.store.catalog import Catalog

    shutil.rmtree(CORPUS, ignore_errors=True)
    corpus = CORPUS
    build_index(str(_corpus(corpus, 1)), Catalog(work / "built"), cfg)
    cases = {"build": table_digests(work / "built")}
    shutil.copytree(work / "built", work / "updated")
    update_index(str(_corpus(corpus, 2)), Catalog(work / "updated"), cfg)
    cases["update"] = table_digests(work / "updated")
    return cases


@pytest.mark.slow
def test_build_and_update_publish_the_pinned_tables(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    assert build_cases(tmp_path) == golden


def test_a_merge_in_its_child_process_publishes_the_same_build_and_update(tmp_path):
    """A large build or update extracts, merges and validates in child processes (``MERGE_IN_CHILD_ROWS``,
    ``extraction_mapper``, ``validation_mapper``); with the threshold at 0 the small corpus takes those paths too
    (an update's merge child opens the index again: ``SnapshotReads``), and the tables are the pinned ones."""
    from unittest import mock

    from flows.pipeline import build_index, update_index
    from schemas.config import load_config
    from tasks.store.catalog import Catalog

    golden = json.loads(GOLDEN.read_text())
    shutil.rmtree(CORPUS, ignore_errors=True)
    from tasks.runtime import parallel

    cfg = load_config(overrides=CONFIG)
    mapped, in_process = parallel.ProcessMapper.__call__, []

    def spy(self, fn, *args, **kwargs):
        in_process.append(fn.__name__)
        return mapped(self, fn, *args, **kwargs)

    with (
        mock.patch("tasks.index.embed.get_embedder", lambda *_a, **_k: HashingEmbedder()),
        mock.patch("tasks.index.merge.MERGE_IN_CHILD_ROWS", 0),
        mock.patch("tasks.runtime.parallel.in_child_process", wraps=parallel.in_child_process) as in_child,
        mock.patch.object(parallel.ProcessMapper, "__call__", spy),
    ):
        build_index(str(_corpus(CORPUS, 1)), Catalog(tmp_path / "built"), cfg)
        assert table_digests(tmp_path / "built") == golden["build"]
        validation = {"check_part", "repeated_values"}
        assert in_process[0] == "batch_mentions" and "check_part" in in_process and set(in_process[1:]) <= validation
        build = len(in_process)
        update_index(str(_corpus(CORPUS, 2)), Catalog(tmp_path / "built"), cfg)
    assert [c.args[0].__name__ for c in in_child.call_args_list] == ["merge_spilled", "update_layer0"]
    assert in_process[build] == "batch_mentions" and "check_part" in in_process[build:]
    assert set(in_process[build + 1 :]) <= validation
    assert table_digests(tmp_path / "built") == golden["update"]


def test_reports_made_a_part_at_a_time_are_the_pinned_reports(tmp_path):
    """With parts of 40 member entities (about ten tasks, ``report_parts``) a build's reports are those of one
    task, row for row, in the order of their parts: ratings relative to the strongest of every part."""
    from unittest import mock

    from flows.pipeline import build_index
    from schemas.config import load_config
    from tasks.store.catalog import Catalog

    golden = json.loads(GOLDEN.read_text())["build"]
    shutil.rmtree(CORPUS, ignore_errors=True)
    cfg = load_config(overrides={**CONFIG, "dask": {**CONFIG["dask"], "report_part_entities": 40}})
    with mock.patch("tasks.index.embed.get_embedder", lambda *_a, **_k: HashingEmbedder()):
        build_index(str(_corpus(CORPUS, 1)), Catalog(tmp_path / "built"), cfg)
    cat = Catalog(tmp_path / "built")
    snap = cat.require_snapshot()
    reports, communities = cat.read("community_reports", snap=snap), cat.read("communities", snap=snap)
    at = {c: i for i, c in enumerate(reports.column("community_id").to_pylist())}
    order = [at[c] for c in communities.column("id").to_pylist()]
    assert order != sorted(order), "the reports came in the communities' order: one part?"
    assert digest(reports.take(order)) == golden["community_reports"]
    assert table_digests(tmp_path / "built", also_drop=()) | {"community_reports": golden["community_reports"]} == golden


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import tests.conftest  # noqa: F401  (offline settings)

    with tempfile.TemporaryDirectory() as tmp:
        cases = build_cases(Path(tmp))
    print(json.dumps(cases, indent=2))
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(cases, indent=2) + "\n")
        print(f"wrote {GOLDEN}")


def test_the_same_corpus_at_two_places_gives_the_same_layer_zero_and_the_same_contexts(tmp_path):
    """Ids hash the corpus root, but nothing else depends on where the corpus lies: every description (ordered
    by document source and position, not by root-hashed ids), relation weight and retrieved context is the same
    for the same corpus at two paths."""
    from unittest import mock

    import numpy as np

    from flows.pipeline import build_index
    from schemas.config import load_config
    from tasks.query.retrieve import retrieve
    from tasks.retrieval.view import load_view
    from tasks.store.catalog import Catalog
    from tests.conftest import write_small_corpus

    cfg = load_config(overrides=CONFIG)
    questions = ["Who was Scrooge's clerk?", "Where was the counting-house?", "Who wrote the journal?"]
    seen = []
    for place in ("a/corpus", "somewhere/else/entirely"):
        corpus = write_small_corpus(tmp_path / place)
        with mock.patch("tasks.index.embed.get_embedder", lambda *_a, **_k: HashingEmbedder()):
            build_index(str(corpus), Catalog(tmp_path / place / "index"), cfg)
        cat = Catalog(tmp_path / place / "index")
        entities = sorted(
            (e["layer"], e["name"], e["type"], e["description"]) for e in cat.read("entities").to_pylist()
        )
        relations = sorted((r["kind"], r["description"], r["weight"]) for r in cat.read("relations").to_pylist())
        view = load_view(cat)
        contexts = [
            retrieve(view, q, HashingEmbedder().embed([q])[0].astype(np.float32), mode, cfg.retrieval).text()
            for q in questions
            for mode in ("hi", "naive")
        ]
        seen.append((entities, relations, contexts))
    assert seen[0][0] == seen[1][0] and seen[0][1] == seen[1][1]
    assert seen[0][2] == seen[1][2] and all(seen[0][2])
