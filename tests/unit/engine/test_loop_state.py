"""The loop's one state: saved whole through the checkpoint's files and restored whole (no model, no run)."""

from __future__ import annotations

import random

import torch

from leantrain.engine.training.loop_state import BestRecord, LoopState
from leantrain.engine.checkpoint.state_io import load_state, save_state


def _saved_and_loaded(state: LoopState, folder, steps_per_epoch: int) -> LoopState:
    """``state`` written as a checkpoint writes it (trainer_state + this process's rank file) and read back."""
    saved = state.state_dict()
    save_state(saved["trainer"], folder, "trainer_state")
    save_state(saved["rank"], folder, "rank-0")
    back = LoopState.fresh(torch.device("cpu"))
    back.load_state_dict({"trainer": load_state(folder, "trainer_state"), "rank": load_state(folder, "rank-0")},
                         steps_per_epoch, torch.device("cpu"))
    return back


def test_state_dict_roundtrip_keeps_every_counter_and_the_generators(tmp_path):
    best = BestRecord(value=0.25, step=6, evals_since=1, metrics={"loss": 0.25, "accuracy": 0.5})
    state = LoopState(step=7, epoch=1, start_step=3, running=torch.tensor(2.5), running_count=12.5, eval_step=6,
                      last_eval={"loss": 0.25, "accuracy": 0.5}, best=best)
    torch.manual_seed(3)
    random.seed(3)
    back = _saved_and_loaded(state, tmp_path, steps_per_epoch=5)
    after_save = (torch.rand(4), random.random())  # what the uninterrupted run draws next

    assert (back.step, back.epoch, back.start_step) == (7, 1, 2)  # the position is the step's, not the saved epoch
    assert back.best == best and back.eval_step == 6 and back.last_eval == state.last_eval
    assert torch.equal(back.running, state.running) and back.running_count == 12.5
    torch.manual_seed(99)
    random.seed(99)
    back.apply_rng(seed=0, rank=0)
    assert torch.equal(torch.rand(4), after_save[0]) and random.random() == after_save[1]


def test_a_step_at_an_epoch_end_resumes_at_the_next_epoch_start(tmp_path):
    state = LoopState(step=10, epoch=1, running=torch.zeros(()))  # the loop saves epoch 1 at its last step
    back = _saved_and_loaded(state, tmp_path, steps_per_epoch=5)
    assert (back.epoch, back.start_step) == (2, 0)
    assert back.best == BestRecord() and back.eval_step == -1
    back.next_epoch()
    assert (back.epoch, back.start_step) == (3, 0)


def test_the_checkpoint_files_keep_their_keys(tmp_path):
    """Checkpoints written before the loop had one state object read the same keys: the layout on disk is unchanged."""
    saved = LoopState(step=4, running=torch.zeros(())).state_dict()
    assert set(saved["trainer"]) == {"step", "epoch", "best", "eval_step", "last_eval"}
    assert set(saved["trainer"]["best"]) == {"value", "step", "evals_since", "metrics"}
    assert set(saved["rank"]) == {"rng", "running_loss", "running_count"}
