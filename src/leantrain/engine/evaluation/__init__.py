"""Evaluation during and after training (``evaluate``, ``eval_plan``, ``eval_schedule``), lm-eval harness scores
(``harness``) and sample generations (``samples``)."""
