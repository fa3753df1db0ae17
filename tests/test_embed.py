"""The packaged MiniLM on its two runtimes gives the same vectors; the ONNX export is made once, in place."""

import numpy as np

from tasks.embed import LocalEmbedder

TEXTS = ["Ebenezer Scrooge (person): a miser of London.", "Jacob Marley", "The Journal of Mathematical Physics is "
         "a peer-reviewed journal published monthly by the American Institute of Physics.", "", "Fezziwig " * 300]


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
