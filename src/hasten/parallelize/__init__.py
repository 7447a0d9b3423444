"""Laying a model out over the run's mesh: one module per step (see `parallelize`)."""
