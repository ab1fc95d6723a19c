"""``model.name`` checked before anything loads it: a local-looking path that does not exist is reported as a
missing folder (not as a malformed Hub id), and a Hub id answers in seconds: from the local cache, or with one
request with a short timeout, instead of transformers' retries (97 s measured for an unknown id with the network on).
With ``HF_HUB_OFFLINE=1`` only the cache is consulted."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from leantrain.errors import ConfigError

HUB_TIMEOUT = float(os.environ.get("LEANTRAIN_HUB_TIMEOUT", "10"))  # seconds for the one probe request
_checked: set[tuple[str, str | None]] = set()


def looks_local(name: str) -> bool:
    """A path rather than a Hub id (``org/name`` or ``name``): starts with / ./ ../ ~, holds a backslash or
    more than one slash, or ends with a slash."""
    return name.startswith(("/", "./", "../", "~", ".\\")) or "\\" in name or name.count("/") > 1 \
        or name.endswith("/") or name in (".", "..")


def offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE) or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")


def in_cache(name: str, revision: str | None) -> bool:
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, "config.json", revision=revision)
    except Exception:  # noqa: BLE001 - a malformed id: the probe / loader names it
        return False
    return isinstance(found, str)


def probe(name: str, revision: str | None, timeout: float) -> None:
    """One metadata request to the Hub; raises what huggingface_hub raises."""
    from huggingface_hub import HfApi

    HfApi().model_info(name, revision=revision, timeout=timeout)


def check_model_name(name: str, revision: str | None = None) -> None:
    """ConfigError (exit 2) naming ``model.name`` when it cannot be found; fast in every case."""
    path = Path(name).expanduser()
    if path.exists() or (name, revision) in _checked:
        return
    if looks_local(name):
        raise ConfigError(f"model.name={name}: no such folder ({path.absolute()})")
    if in_cache(name, revision):
        _checked.add((name, revision))
        return
    if offline():
        raise ConfigError(f"model.name={name}: not a local folder, and not in the Hugging Face cache while "
                          "HF_HUB_OFFLINE=1; download it once with the network on, or give a local folder")
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            probe(name, revision, HUB_TIMEOUT)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True)  # DNS lookups ignore request timeouts
    worker.start()
    worker.join(HUB_TIMEOUT + 5)
    if not outcome:
        raise ConfigError(f"model.name={name}: the Hugging Face Hub did not answer within {HUB_TIMEOUT + 5:.0f} s; "
                          "check the network, or set HF_HUB_OFFLINE=1 to use the local cache only")
    err = outcome[0]
    if err is None:
        _checked.add((name, revision))
        return
    kind = type(err).__name__
    if kind == "RepositoryNotFoundError":
        raise ConfigError(f"model.name={name}: no such model on the Hugging Face Hub (or it is private: log in "
                          "with `hf auth login`); for a local folder, write a path such as ./" + name) from None
    if kind == "RevisionNotFoundError":
        raise ConfigError(f"model.name={name}: no revision {revision!r} on the Hub (model.revision)") from None
    if kind == "GatedRepoError":
        raise ConfigError(f"model.name={name}: a gated model; accept its terms on the Hub and log in "
                          "with `hf auth login`") from None
    if kind in ("HfHubHTTPError",) and "401" in str(err):
        raise ConfigError(f"model.name={name}: the Hub refused access (401); log in with `hf auth login`") from None
    raise ConfigError(f"model.name={name}: the Hugging Face Hub could not be reached ({kind}: "
                      f"{str(err).splitlines()[0] if str(err) else ''}); check the network, or set HF_HUB_OFFLINE=1 "
                      "to use the local cache only") from None
