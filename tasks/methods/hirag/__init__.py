"""HiRAG (HiRAG §4): GMM summary layers stopped by the cluster-sparsity rule (``hierarchy``), Leiden communities
over all layers (``communities``) kept under updates (``placement``), and the three retrieval levels
(``retrieval``); ``method`` is the ``HiRAG`` index method that composes them."""
