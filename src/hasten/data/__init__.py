"""Which batches each process reads: samplers, sharded and dispatched loaders, skipping and resuming, metrics gathering."""
