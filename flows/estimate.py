"""``--estimate``: what a build, an update or a backfill partition would spend on LLM calls, per stage, before any
call — the run's first two stages (ingest and, for an update, the diff; chunking) on this machine, in a folder of
its own, then ``tasks.index.llm_estimate`` (a HiRAG update's summaries and reports walked on the index it updates:
``tasks.methods.update_estimate``). No model is called, the index is neither locked nor written."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.env import apply_offline_defaults
from flows.pipeline import corpus_root
from flows.run import PipelineRun
from flows.steps import chunk, extraction_method, ingest
from schemas.config import StrataConfig
from schemas.llm import Stage
from tasks.errors import IndexNotFound
from tasks.index.embed import LOCAL_MODEL, question_embedder
from tasks.index.estimate_names import model_mentions, names_in, offline_entities, offline_mentions
from tasks.index.extract import extraction_batches
from tasks.index.llm_estimate import (
    CountingClient,
    StageEstimate,
    answered_by,
    cached_stage,
    extraction_estimate,
    learned_ratios,
    scaled_estimate,
    stage_ratios,
)
from tasks.methods.update_estimate import layer0_delta, walk_reports, walk_summaries
from tasks.runtime.llm_client import ResponseCache, Usage
from tasks.runtime.parallel import LocalMapper
from tasks.runtime.progress import LogReporter
from tasks.runtime.stages import Stages
from tasks.store.catalog import Catalog


class _EstimateRun(PipelineRun):
    """A run whose work folder is a temporary one: a writer running beside the estimate keeps its own."""

    folder = ""

    @property
    def work_root(self) -> str:
        return self.folder


def estimate_run(
    corpus: str, index: str, cfg: StrataConfig, full: bool = False, replace_root: str | None = None
) -> dict[str, Any]:
    """Per LLM stage, the calls, input and expected output tokens and USD of the run ``index``/``update`` would make on
    ``corpus`` now (an update: of its diff against the published snapshot; ``full``: of every document), with the
    answers already in the index's response cache subtracted."""

    apply_offline_defaults()
    with tempfile.TemporaryDirectory(prefix="strata-estimate-") as folder:
        try:
            catalog, exists = Catalog(index, create=False, storage=cfg.storage), True
        except IndexNotFound:  # a first build: nothing cached, no run to learn from
            catalog, exists = Catalog(Path(folder) / "index"), False
        latest = catalog.snapshot() if exists else None
        snap = None if full else latest
        run = _EstimateRun(
            corpus,
            catalog,
            cfg,
            Stages(LogReporter()),
            LocalMapper(),
            "estimate",
            latest["version"] + 1 if latest else 1,
            snap,
            Usage(),
        )
        run.folder = folder
        run.root = corpus_root(run, replace_root)
        delta = ingest(run)
        result: dict[str, Any] = {"corpus": corpus, "index": index, "kind": "update" if snap else "build"}
        if delta.empty:
            return {**result, "documents": 0, "chunks": 0, "corpus_tokens": 0, "stages": [], "total": _total([])}
        _documents, chunks, _places = chunk(run, delta)
        tokens = int(run.stages.log["chunk"].get("tokens", 0))
        path = catalog.cache_dir / "llm_cache.sqlite"
        cache = ResponseCache(path) if exists and cfg.llm.cache and path.exists() else None
        runs = catalog.runs() if exists else []
        learned = learned_ratios(runs, result["kind"], cfg.fingerprint())
        extractor = extraction_method(cfg)
        rows = []
        extraction = cfg.llm.stage("extraction")
        names: set[str] = set()

        def batches() -> Iterator[list[str]]:  # as extraction's tasks read them; the things they name noted
            for texts in extraction_batches(chunks, cfg.extract.batch_size):
                for text in texts:
                    names.update(names_in(text))
                yield texts

        if extraction is not None and extractor == "llm":
            rows.append(
                extraction_estimate(batches(), extraction, cfg.llm.gleanings, cache, cfg.llm.extraction.pack_tokens)
            )
        else:
            for _ in batches():
                pass
        units = {"corpus token": tokens, "name": len(names)}
        # extraction answered from the cache (or offline): a finished run on the same documents and settings made
        # the same summary and report prompts
        same = None
        if not rows or rows[0].calls == 0:
            same = answered_by(runs, result["kind"], delta.digest, cfg.fingerprint())
        stages: tuple[Stage, ...] = ("summaries", "reports") if cfg.hierarchy.enabled else ("reports",)
        scaled = [s for s in stages if cfg.llm.stage(s) is not None and (same is None or cache is None)]
        # a HiRAG update walks its own rules on the snapshot (``update_estimate``): which summaries and communities
        # the new chunks reach, and how large they are, is in the index, not in a ratio (an API embedding model
        # would be paid for the added entities' vectors: the ratios stand in there)
        walk = None
        if snap and scaled and cfg.index.method == "hirag" and cfg.embedding.model == LOCAL_MODEL:
            with run.stage("estimate: the update walked", chunks.num_rows) as st:
                most = cfg.extract.max_description_tokens  # what a description holds
                # corpus order is by document source: the new documents' sentences come after every held one's
                # only where each new source sorts after every kept one
                first = min((d["source_id"] for d in delta.incoming), default="") <= max(
                    (d["source_id"] for d in delta.kept), default=""
                )
                new_chunks = list(_chunk_rows(chunks, st))
                if extractor == "llm":
                    walk = layer0_delta(run, [model_mentions(c["text"]) for c in new_chunks], most, first=first)
                else:
                    found = list(offline_mentions(new_chunks, cfg.extract))  # every chunk, in order
                    walk = layer0_delta(
                        run,
                        [names for _, names, _ in found],
                        most,
                        [p for *_, pairs in found for p in pairs],
                        first=first,
                    )
        if walk is None and extractor == "nlp" and scaled and not learned.keys() >= set(scaled):
            # the graph the model's summaries and reports are made from is the offline extractor's: found, not
            # guessed (its tokens are free; its time is the extraction stage's)
            with run.stage("estimate: offline entities", chunks.num_rows) as st:
                units["entity"] = offline_entities(_chunk_rows(chunks, st), cfg.extract)
        # the graph summaries and reports are made from: the offline extractor's, or a model's (without descriptions
        # where extraction is packed)
        graph = "packed" if extractor == "llm" and cfg.llm.extraction.pack_tokens else extractor
        attached: dict[str, str] | None = None  # where the walk's added entities joined a summary

        def embed(texts: list[str]) -> Any:  # the packaged model, on ONNX Runtime: nothing written, nothing paid
            return question_embedder(cfg.embedding, threads=None).embed(texts)

        for stage in stages:
            model = cfg.llm.stage(stage)
            if model is None:
                continue
            if same is not None and cache is not None:
                rows.append(cached_stage(stage, model, same))
            elif walk is not None:
                ratios = stage_ratios(stage, graph, result["kind"], learned)  # what a prompt's answer costs
                est = StageEstimate(stage, model.model, basis="walked on the index")
                client = CountingClient(model, cache, est, ratios.output)
                if stage == "summaries":
                    attached = walk_summaries(run, walk, embed, client, cfg)
                else:
                    if attached is None:  # summaries written offline: an added entity still joins one
                        attached = walk_summaries(run, walk, embed, None, cfg) if cfg.hierarchy.enabled else {}
                    walk_reports(run, walk, attached, client, cfg)
                rows.append(est.priced(model))
            else:
                ratios = stage_ratios(stage, graph, result["kind"], learned)
                k = getattr(cfg.llm, stage).min_members
                rows.append(scaled_estimate(stage, model, units, ratios, k, result["kind"]))
        out = [r.row() for r in rows]
        return {
            **result,
            "documents": len(delta.incoming),
            "chunks": chunks.num_rows,
            "corpus_tokens": tokens,
            "names": units["name"],
            "entities": units.get("entity"),
            "stages": out,
            "total": _total(out),
            "max_cost_usd": cfg.llm.max_cost_usd,
        }


def _chunk_rows(chunks: Any, stage: Any) -> Iterator[dict[str, Any]]:
    """Each chunk as ``{id, text, title, document_id, chunk_index}``, a part at a time, advancing ``stage``'s
    progress."""
    for part in chunks.parts(["id", "text", "title", "document_id", "chunk_index"]):
        rows = part.to_pylist()
        yield from rows
        stage.advance(len(rows))


def _total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    keys = ("calls", "cached", "input_tokens", "output_tokens")
    total: dict[str, Any] = {k: sum(r[k] for r in rows) for k in keys}
    total["cost_usd"] = round(sum(r["cost_usd"] for r in rows), 6)
    return total
