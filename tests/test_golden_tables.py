"""The tables a build and an update publish, pinned by digest: a refactor of the orchestration must not
change one id, row, vector or layer statistic. Regenerate (only for an intended change of output) with

    .venv/bin/python -m tests.test_golden_tables --write
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest

GOLDEN = Path(__file__).resolve().parent / "data" / "golden_digests.json"
#: columns that legitimately differ between two runs: where the corpus lies, when it was read, how long it took
VOLATILE = {"documents": {"uri", "root", "ingested_at"}, "layers": {"seconds"}}
CONFIG = {"chunking": {"size": 200, "overlap": 20}, "extract": {"batch_size": 4}, "dask": {"processes": False}}


def table_digests(index: Path, also_drop: tuple[str, ...] = ()) -> dict[str, str]:
    """A digest per table of the published snapshot, without the ``VOLATILE`` columns and ``also_drop``."""
    from schemas.tables import SNAPSHOT_TABLES
    from tasks.catalog import Catalog

    cat = Catalog(index)
    snap = cat.require_snapshot()
    out = {}
    for name in SNAPSHOT_TABLES:
        table = cat.read(name, snap=snap)
        table = table.drop([c for c in {*VOLATILE.get(name, ()), *also_drop} if c in table.column_names])
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        out[name] = f"{table.num_rows}:{hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()[:16]}"
    return out


def _corpus(root: Path, step: int) -> Path:
    """Step 1: two book slices, a note and 12 MuSiQue passages; step 2: one slice edited, one file deleted, one added."""
    from tests.conftest import write_small_corpus

    write_small_corpus(root)
    if step == 2:
        (root / "carol_2.txt").unlink()
        with (root / "carol_1.txt").open("a", encoding="utf-8") as fh:
            fh.write("\nScrooge kept a counting-house in the City of London, near Cornhill.\n")
        (root / "notes" / "fezziwig.md").write_text(
            "# Fezziwig\n\nOld Fezziwig was the merchant to whom young Ebenezer Scrooge was apprenticed.\n", encoding="utf-8")
    return root


#: document ids hash their corpus root, so the corpus always lies at the same place
CORPUS = Path(tempfile.gettempdir()) / "strata-golden-corpus"


def build_cases(work: Path) -> dict[str, dict[str, str]]:
    from flows.pipeline import build_index, update_index
    from schemas.config import load_config
    from tasks.catalog import Catalog

    cfg = load_config(overrides=CONFIG)
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


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import tests.conftest  # noqa: F401  (offline settings)

    with tempfile.TemporaryDirectory() as tmp:
        cases = build_cases(Path(tmp))
    print(json.dumps(cases, indent=2))
    if "--write" in sys.argv:
        GOLDEN.write_text(json.dumps(cases, indent=2) + "\n")
        print(f"wrote {GOLDEN}")
