"""Preference methods: the DPO family (``preference``, losses in ``losses``), KTO (``kto``) and reward models
(``reward_model``)."""
