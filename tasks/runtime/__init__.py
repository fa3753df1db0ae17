"""How a run runs: the stage runner (``stages``), Dask and child processes (``parallel``), the one LLM client
(``llm_client``) and its interface (``llm``), progress reporting (``progress``) and text helpers (``text``)."""
