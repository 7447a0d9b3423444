"""Who is in the run and how they talk: cluster detection, NUMA pinning, process-group bootstrap, collectives, RNG sync, tensor/context parallel plans."""
