"""Answering questions from a published snapshot, above the methods: ``retrieve`` (the entry: a mode's context),
``answer``, ``evaluate``, ``reader`` (the set-up of query, shell, eval and serve), ``browse`` and ``inspect``, with
``candidates`` and ``packing`` (the offline answer's sentences, a context's sources). The primitives they and the
methods share are in ``tasks.retrieval``."""
