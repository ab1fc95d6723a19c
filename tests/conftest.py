"""Shared fixtures: a tiny random BERT folder (built from a config, no download), the packaged MiniLM, an own
datasets cache. Helper functions and constants are in tests/helpers.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import make_tiny_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach for the Hub
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# report.trackers=[trackio] writes to the SQLite store under TRACKIO_DIR, which trackio reads once, at its import:
# the tests' runs go to a folder of this process's own, never to the user's ~/.cache/huggingface/trackio
_TRACKIO_DIR = tempfile.mkdtemp(prefix="leantrain-tests-trackio-")
os.environ["TRACKIO_DIR"] = _TRACKIO_DIR


def pytest_sessionfinish(session, exitstatus) -> None:  # noqa: ANN001
    shutil.rmtree(_TRACKIO_DIR, ignore_errors=True)
    # the fork server tests.helpers.cli_process starts (torch and transformers preloaded, ~330 MB) outlived the test
    # processes that started it, one per xdist worker and run: stop it with them
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()


def pytest_collection_modifyitems(config, items) -> None:  # noqa: ANN001
    """The longest files first: those with multi-process runs, then those marked slow, then the other integration
    files, then the unit files, each file's tests together and in their order. pytest-xdist hands out whole files in this order (``make test``:
    ``--dist loadscope --no-loadscope-reorder``), so the many short unit files end the run on both workers instead of
    one worker finishing a long file alone while the other waits."""
    weight: dict[str, int] = {}
    for item in items:
        path = str(item.path)
        rank = 0 if item.get_closest_marker("distributed") else 1 if item.get_closest_marker("slow") else \
            2 if "integration" in item.path.parts else 3
        weight[path] = min(weight.get(path, 3), rank)
    items.sort(key=lambda item: weight[str(item.path)])  # stable: a file's tests keep their order


def _share_the_cores() -> None:
    """Under pytest-xdist each worker gets its share of the cores (torch's intra-op threads, and OMP_NUM_THREADS for
    the processes a test starts without setting it): N workers x all cores each oversubscribes the CPU, and the
    tiny models here lose more to thread hand-offs than they gain from a second thread."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        import torch

        torch.set_num_threads(threads)


_share_the_cores()


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return make_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def minilm() -> str:
    from leantrain.modeling import packaged_model_path

    return packaged_model_path()


@pytest.fixture
def own_datasets_cache(tmp_path_factory, monkeypatch):
    """This test gets its own Arrow cache, so nothing is read from (or left in) ~/.cache.
    Use it for a whole file with ``pytestmark = pytest.mark.usefixtures("own_datasets_cache")``."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf_cache")))
