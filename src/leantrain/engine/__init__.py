"""Engine: the training run: accelerator set-up, training data, batch layout, the loop and the step, evaluation,
checkpoints and resume, distributed strategies, the non-finite guard, fault injection."""
