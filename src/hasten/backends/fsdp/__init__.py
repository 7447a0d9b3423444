"""PyTorch FSDP (1 and 2) as a backend: wrapping, checkpoints, and Accelerate's fsdp_utils functions."""
