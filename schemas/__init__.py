"""Strata schemas: the config model, Arrow table schemas and expectation suites.

This package is the bottom of the import graph (flows -> tasks -> schemas)."""
