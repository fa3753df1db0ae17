"""Answering questions from a published snapshot. Primitives: ``view`` (the snapshot in memory), ``context`` (what a
question's retrieval fills), ``graph_rank`` (Personalized PageRank sources) and ``lexical`` (BM25); the methods'
levels are built on them. Above the methods: ``retrieve`` (the entry), ``answer``, ``evaluate``, ``reader`` (the
set-up of query, shell, eval and serve) and ``inspect``."""
