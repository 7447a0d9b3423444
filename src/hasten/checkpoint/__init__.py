"""Checkpoints: what save_state writes, the durable file layer (fsync, atomic commit, markers), reading back, async saving."""
