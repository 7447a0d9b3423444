"""Who is in the run and how they talk: cluster detection, process-group bootstrap, collectives, RNG sync, tensor/context parallel plans."""
