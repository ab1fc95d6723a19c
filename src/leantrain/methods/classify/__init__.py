"""Classifying methods: text, image and audio classification (``classification``), text regression (``regression``),
multi-label classification (``multilabel``) and tags per word (``token_classification``)."""
