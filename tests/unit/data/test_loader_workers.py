"""DataLoader workers (``data.num_workers``) die with the process they load for (issue 35 item 14): a SIGKILLed run's
workers lived on for 2-4 s (torch's watchdog looks every 5 s) and printed ConnectionResetError. Each worker of the
training and the evaluation loaders asks the kernel for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

import datasets
import numpy as np
import pytest
import torch

from leantrain.data.batching import EpochMicroBatches
from leantrain.data.loaders import eval_loader, train_loader

PR_GET_PDEATHSIG = 2
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")


def death_signal_of_this_worker(rows: list) -> torch.Tensor:
    """A collator: (the signal this process gets when its parent dies, its pid), read inside the worker."""
    sig = ctypes.c_int(0)
    ctypes.CDLL(None, use_errno=True).prctl(PR_GET_PDEATHSIG, ctypes.byref(sig), 0, 0, 0)
    return torch.tensor([sig.value, os.getpid()])


def test_each_loader_worker_dies_with_its_parent():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2]] * 8, "length": [2] * 8})
    batches = EpochMicroBatches([np.arange(i, i + 2) for i in range(0, 8, 2)], rank=0, world_size=1, accum=1)
    loaders = [train_loader(ds, batches, death_signal_of_this_worker, num_workers=2),
               eval_loader(ds, 2, death_signal_of_this_worker, num_workers=2)]
    for loader in loaders:
        seen = [batch.tolist() for batch in loader]
        assert {sig for sig, _ in seen} == {int(signal.SIGKILL)}, seen
        assert os.getpid() not in {pid for _, pid in seen} and len({pid for _, pid in seen}) == 2  # in the workers
