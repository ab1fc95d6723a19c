"""Engine: run set-up, train loop, step, evaluation."""
