"""Checkpoint and resume: atomic checkpoints (save), pickle-free state files (state_io), where a run starts (resume),
the best model and early stopping (best), one run per output_dir (lock), and the stop on SIGTERM / SIGINT at a step
boundary with a checkpoint (preempt)."""
