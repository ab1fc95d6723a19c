"""Distillation (``model.task=distill``): a student learns a frozen teacher's next-token distributions."""
