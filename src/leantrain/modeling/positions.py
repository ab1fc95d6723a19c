"""How many tokens a model takes per example: its config's position limit, lowered by
``model.config_overrides.max_position_embeddings`` (the preflight, eval, generate and sample checks read it)."""

from __future__ import annotations

from leantrain.modeling.load import load_config

POSITION_ATTRS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")
# Models whose position ids start after the padding index (RoBERTa's 514 positions hold 512 tokens).
PADDING_OFFSET_TYPES = {"roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "longformer", "data2vec-text",
                        "ibert", "luke", "markuplm", "roberta-prelayernorm", "xmod", "mpnet", "bart", "mbart"}


def position_limit(config) -> tuple[int, str] | None:  # noqa: ANN001 - a transformers PretrainedConfig
    """(tokens per example the model can take, where that number comes from), or None when the config has none."""
    for attr in POSITION_ATTRS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            kind = getattr(config, "model_type", "")
            if kind in PADDING_OFFSET_TYPES and kind not in ("bart", "mbart"):
                pad = getattr(config, "pad_token_id", None) or 0
                return value - pad - 1, f"{attr}={value} minus the padding offset {pad + 1}"
            return value, f"{attr}={value}"
    return None


def model_position_limit(cfg, config=None) -> tuple[int, str] | None:  # noqa: ANN001 - Config, transformers config
    """``position_limit`` of the run's model (its config, or ``config``), lowered by a
    ``model.config_overrides.max_position_embeddings``."""
    found = position_limit(config if config is not None else load_config(cfg.model))
    if found is None:
        return None
    limit, source = found
    override = cfg.model.config_overrides.get("max_position_embeddings")
    if isinstance(override, int) and 0 < override < limit:
        return override, f"model.config_overrides.max_position_embeddings={override}"
    return limit, source
