"""Launch-time helpers: the command and environment a launch uses, the machine's environment, TPU entry points."""
