"""The build stages every index method shares, in pipeline order: ``ingest`` → ``chunk`` → ``extract`` (NLP) or
``extract_llm`` → ``merge`` (layer 0) → ``embed`` → ``validate``; ``delta`` is an update's share of them (the
documents that changed, layer 0 recomputed for them), ``plots`` the layer figure."""
