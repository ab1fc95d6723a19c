"""Report: progress on the terminal, metrics.jsonl and trackers, plots, the model card, the bench table."""
