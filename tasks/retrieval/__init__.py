"""Retrieval primitives the methods' levels are built on: ``view`` (a published snapshot in memory), ``context``
(what a question's retrieval fills, within its budget), ``graph_rank`` (Personalized PageRank over sources and
entities) and ``lexical`` (BM25). Nothing here knows which methods exist: ``tasks.methods`` builds on these, and
``tasks.query`` (the entry points) on both."""
