"""Models larger than memory: device maps, loading checkpoints into models, offload, bitsandbytes quantization."""
