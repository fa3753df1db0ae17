"""Where an index lives: the catalog of versioned tables and their snapshots (``catalog``), rows and Arrow tables
(``rows``), vector search (``vectors``), object storage (``remote``), deterministic ids (``ids``) and tables too
large to hold, spilled to disk in parts (``spill``)."""
