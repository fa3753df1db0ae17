"""Strata flows (Prefect), the pipeline's stage list and the ``strata`` CLI.

Importing this package changes nothing in the environment: the CLI entry point, the flows and the
tests apply the offline defaults of ``flows.env`` themselves.
"""
