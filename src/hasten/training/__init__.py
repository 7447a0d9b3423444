"""What happens inside a training step: precision policy and fp8, compilation, memory helpers and the batch-size finder."""
