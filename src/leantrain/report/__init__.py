"""Progress, run logs, plots and the model card."""
