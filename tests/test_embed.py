"""The packaged MiniLM on its two runtimes gives the same vectors; the ONNX export is made once, in place."""

import numpy as np

from tasks.index.embed import LocalEmbedder

TEXTS = [
    "Ebenezer Scrooge (person): a miser of London.",
    "Jacob Marley",
    "The Journal of Mathematical Physics is "
    "a peer-reviewed journal published monthly by the American Institute of Physics.",
    "",
    "Fezziwig " * 300,
]


def test_onnx_runtime_matches_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("STRATA_MODEL_CACHE", str(tmp_path))
    onnx = LocalEmbedder(batch_size=2, precision="fp32", runtime="onnx")
    torch = LocalEmbedder(batch_size=2, precision="fp32", runtime="torch")
    a, b = onnx.embed(TEXTS), torch.embed(TEXTS)
    assert a.shape == b.shape == (len(TEXTS), 384) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert (a * b).sum(axis=1).min() > 0.9999  # long text: both cut at the model's 256 tokens
    # the torch path batches by padded tokens itself; its vectors are sentence-transformers' own
    reference = torch._load().encode(TEXTS, normalize_embeddings=True, convert_to_numpy=True)
    assert (b * reference).sum(axis=1).min() > 0.99999
    bf16 = LocalEmbedder(batch_size=2, precision="bf16", runtime="torch").embed(TEXTS)
    assert (bf16 * reference).sum(axis=1).min() > 0.999
    # the export was written once, under the model cache, and is reused
    assert sorted(p.name for p in tmp_path.iterdir()) == [onnx.onnx_path().name, onnx.onnx_path().name + ".data"]
    assert np.array_equal(LocalEmbedder(batch_size=2, precision="fp32", runtime="onnx").embed(TEXTS), a)
    # vectors from the two runtimes never share a cache entry
    assert onnx.cache_name != torch.cache_name
    # a service's questions run on one thread (the other core answers another request), a command's on every
    # core; the same vectors either way
    questions = LocalEmbedder(batch_size=2, precision="fp32", runtime="onnx", small_batches=True, threads=1)
    assert np.allclose(questions.embed(TEXTS), a, atol=1e-6)
    assert questions._onnx().get_session_options().intra_op_num_threads == 1
    alone = LocalEmbedder(batch_size=2, precision="fp32", runtime="onnx", small_batches=True)
    assert np.array_equal(alone.embed(TEXTS), questions.embed(TEXTS))
    assert alone._onnx().get_session_options().intra_op_num_threads != 1
    assert onnx._onnx().get_session_options().intra_op_num_threads != 1
    # word pieces (the offline answer's): the tokenizer's ids without [CLS] and [SEP], unit vectors, either runtime
    pieces, again = onnx.token_vectors(TEXTS), torch.token_vectors(TEXTS)
    vocab = onnx.vocabulary()
    assert [vocab[w] for w in ("jacob", "marley")] == pieces[1][0].tolist() == again[1][0].tolist()
    assert onnx.piece_ids(TEXTS[1:2]) == [pieces[1][0].tolist()]  # the tokenizer alone
    assert [len(p[0]) for p in pieces] == [len(p[0]) for p in again] and len(pieces[4][0]) == 254
    assert pieces[3][1].shape == (0, 384) and np.allclose(np.linalg.norm(pieces[2][1], axis=1), 1.0, atol=1e-5)
    assert min((p[1] * q[1]).sum(axis=1).min() for p, q in zip(pieces, again) if len(p[0])) > 0.999
    assert np.allclose(np.stack([p[2] for p in pieces]), a, atol=1e-6)  # and the text's vector, as embed gives it


def test_a_large_call_moves_the_model_to_a_child_process_for_the_rest_of_the_run(monkeypatch):
    """Below ``EMBED_IN_CHILD_TEXTS`` texts a call embeds in process; from the first call at or above it, every
    call goes to one child process until ``release``; the vectors are the in-process ones, bit for bit."""
    from schemas.config import load_config
    from tasks.index import embed

    cfg = load_config().embedding.model_copy(update={"runtime": "onnx", "precision": "fp32"})  # on any CPU
    local = embed.get_embedder(cfg)
    child = embed.ChildEmbedder(local, cfg)
    monkeypatch.setattr(embed, "EMBED_IN_CHILD_TEXTS", 3)
    assert np.array_equal(child.embed(TEXTS[:2]), local.embed(TEXTS[:2])) and not child.mapper.started
    assert np.array_equal(child.embed(TEXTS[:3]), local.embed(TEXTS[:3])) and child.mapper.started
    pool = child.mapper._pool
    assert np.array_equal(child.embed(TEXTS[3:4]), local.embed(TEXTS[3:4])) and child.mapper._pool is pool
    processes = list(pool._processes.values())
    child.release()
    assert not child.mapper.started and all(not p.is_alive() for p in processes)
    # a stage that says it will embed 3 texts a step at a time sends even its 1-text steps to the child
    fresh = embed.ChildEmbedder(local, cfg)
    fresh.expect(3)
    assert np.array_equal(fresh.embed(TEXTS[:1]), local.embed(TEXTS[:1])) and fresh.mapper.started
    fresh.release()


def test_auto_runtime_takes_pytorch_only_for_a_run_that_pays_for_its_import(monkeypatch):
    """Where bf16 is native, 'auto' picks PyTorch, whose import and load (~7 s) a run of fewer than
    ``TORCH_PAYS_TEXTS`` texts does not earn back: such a run embeds on ONNX Runtime, in process, in a child and on a
    cluster's workers, with its own cache entries; the choice is made once, before the run's first vector, and
    kept; a runtime set explicitly is never changed."""
    from schemas.config import load_config
    from tasks.index import embed

    monkeypatch.setattr(embed, "bf16_is_fast", lambda: True)
    cfg = load_config().embedding
    auto = embed.LocalEmbedder(runtime="auto", precision="auto")
    assert auto.runtime == "torch" and auto.auto_torch
    small = embed.ChildEmbedder(auto, cfg)
    small.expect(embed.TORCH_PAYS_TEXTS - 1)
    assert small.local.runtime == "onnx" and small.cfg.runtime == "onnx" and small.cfg.precision == "fp32"
    assert small.cache_name == small.local.cache_name != auto.cache_name
    small.expect(embed.TORCH_PAYS_TEXTS * 10)  # a later, larger stage of the same run keeps the choice
    assert small.local.runtime == "onnx"
    large = embed.ChildEmbedder(auto, cfg)
    large.expect(embed.TORCH_PAYS_TEXTS)
    assert large.local is auto and large.cfg.runtime == "auto" and large.cache_name == auto.cache_name
    # the run's cache wrapper makes the choice before it computes its keys: a 2-text run reads ONNX's entries
    cached = embed.CachedEmbedder(embed.ChildEmbedder(auto, cfg), None)
    assert np.array_equal(cached.embed(TEXTS[:2]), cached.inner.local.embed(TEXTS[:2]))
    assert cached.inner.local.runtime == "onnx"
    # a cluster's workers are told the same choice (the CI failure this guards: a cluster run embedding on PyTorch
    # beside an in-process run on ONNX gave other vectors, so another hierarchy)
    sent: list = []
    mapped = embed.MappedEmbedder(auto, cfg, lambda fn, parts, **kw: sent.append(kw["cfg"]))
    mapped.embed_parts([TEXTS[:2]], on_done=lambda *_: None)
    assert sent[0].runtime == "onnx" and mapped.cache_name == small.cache_name
    explicit = embed.LocalEmbedder(runtime="torch", precision="auto")
    fixed = embed.ChildEmbedder(explicit, cfg)
    fixed.expect(1)
    assert fixed.local is explicit and not explicit.auto_torch


def test_a_table_is_embedded_a_step_at_a_time_one_file_a_part(tmp_path):
    """``embed_table``: every embed call but the last gets exactly ``EMBED_STEP`` texts, whatever the parts'
    sizes (a text's batch does not depend on where the table was cut); each part comes back as one file, its
    rows in order with their own vectors and the run's version; an empty part is an empty file."""
    from types import SimpleNamespace

    import pyarrow as pa
    import pyarrow.parquet as pq

    from schemas.tables import schema_for
    from tasks.index.embed_table import EMBED_STEP, embed_table

    calls: list[int] = []

    def embed(texts, progress=None):
        calls.append(len(texts))
        return np.array([[float(t.split()[1]), 1.0, 0.0] for t in texts], np.float32)

    ctx = SimpleNamespace(spill_dir=tmp_path, embedder=SimpleNamespace(dim=3), embed=embed, version=7)
    columns = [c for c in schema_for("chunks", 3).names if c not in ("vector", "version")]
    schema = pa.schema([schema_for("chunks", 3).field(c) for c in columns])
    ints = ("chunk_index", "n_tokens", "start", "end")
    sizes, at, parts = [EMBED_STEP + 5, 0, 3, 2 * EMBED_STEP + 1], 0, []
    for size in sizes:
        span = range(at, at + size)
        value = {c: (lambda i: i) if c in ints else (lambda i: f"chunk {i}") for c in columns}
        parts.append(pa.table({c: [value[c](i) for i in span] for c in columns}, schema=schema))
        at += size
    out = embed_table(ctx, "chunks", iter(parts), lambda t: t.column("text").to_pylist())
    total = sum(sizes)
    assert out.num_rows == total and len(out.files) == len(sizes)
    assert calls[:-1] == [EMBED_STEP] * (len(calls) - 1) and sum(calls) == total
    seen = 0
    for f, size in zip(out.files, sizes):
        t = pq.read_table(f)
        assert t.num_rows == size
        ids = [int(i) for i in t.column("chunk_index").to_pylist()]
        assert ids == list(range(seen, seen + size))
        assert [v[0] for v in t.column("vector").to_pylist()] == [float(i) for i in ids]
        assert set(t.column("version").to_pylist()) <= {7}
        seen += size
    assert not list(tmp_path.rglob("*.tmp"))
