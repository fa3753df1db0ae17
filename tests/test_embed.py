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
    assert [p.name for p in tmp_path.iterdir()] == [onnx.onnx_path().name]
    assert np.array_equal(LocalEmbedder(batch_size=2, precision="fp32", runtime="onnx").embed(TEXTS), a)
    # vectors from the two runtimes never share a cache entry
    assert onnx.cache_name != torch.cache_name


def test_a_large_call_moves_the_model_to_a_child_process_for_the_rest_of_the_run(monkeypatch):
    """Below ``EMBED_IN_CHILD_TEXTS`` texts a call embeds in process; from the first call at or above it, every
    call goes to one child process until ``release``; the vectors are the in-process ones, bit for bit."""
    from schemas.config import load_config
    from tasks.index import embed

    cfg = load_config().embedding
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
