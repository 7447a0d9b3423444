"""Seeing a run: the profiler, the memory tracker, the step timer and progress bars."""
