"""torch_xla (TPU, or its CPU device) as a backend: data parallel replicas, gradients reduced at the optimizer step."""
