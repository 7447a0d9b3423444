"""DeepSpeed ZeRO as a backend: the engine, and the wrappers prepare hands back."""
