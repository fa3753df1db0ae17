"""Strata stages: small typed pure functions, one module per stage, composed by ``flows``."""
