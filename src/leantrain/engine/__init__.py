"""Engine: the training run: accelerator set-up, training data, batch layout, loop, step, eval, checkpoints, resume."""
