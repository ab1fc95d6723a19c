"""Process memory readings (perf/memory.py) and the budget helpers of automatic micro-batch
(perf/auto_micro_batch.py): byte sizes, divisors, the margin, the sequence length sized for, the CPU budget."""

import sys
from types import SimpleNamespace

import pytest
import torch

from leantrain.config import resolve
from leantrain.errors import ConfigError
from leantrain.perf import memory
from leantrain.perf.auto_micro_batch import (MARGIN, RAM_SHARE, RUN_ALLOWANCE, default_budget, divisors_desc,
                                             longest_sequence, need_bytes, parse_bytes)

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


@linux
def test_rss_readings_grow_with_a_touched_allocation():
    before = memory.current_rss_bytes()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, written so it is resident
    assert memory.current_rss_bytes() >= before + 48 * 2**20
    assert memory.peak_rss_bytes() >= memory.current_rss_bytes() > 0
    del block


@linux
def test_a_reset_window_forgets_an_earlier_peak_but_the_whole_life_peak_keeps_it():
    block = torch.ones(128 * 2**20 // 4)
    high = memory.peak_rss_bytes()
    del block
    memory.trim_heap()
    if not memory.reset_peak_rss():
        pytest.skip("this kernel cannot reset VmHWM")
    # the kernel's RSS counters are approximate by a few pages between readings: compare with 8 MiB of slack
    assert memory.peak_rss_bytes() >= high - 8 * 2**20  # the whole-life peak survives the reset
    assert memory.window_peak_rss_bytes() < high - 64 * 2**20  # the 128 MiB block was freed before the window began


def test_device_memory_is_empty_on_cpu():
    assert memory.device_memory(torch.device("cpu")) == {}


@pytest.mark.parametrize("text, expected", [
    ("1.5GB", 1_500_000_000), (" 2 gib ", 2 * 2**30), ("512", 512), ("10kb", 10_000), ("3MiB", 3 * 2**20),
    (4096, 4096),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "4 parsecs", "-1GiB", "1e9"])
def test_parse_bytes_rejects_with_the_key(text):
    with pytest.raises(ConfigError, match="efficiency.memory_budget"):
        parse_bytes(text)


def test_divisors_desc():
    assert divisors_desc(12) == [12, 6, 4, 3, 2, 1] and divisors_desc(7) == [7, 1] and divisors_desc(1) == [1]


def test_need_bytes_puts_the_margin_on_the_training_part_only():
    lines = {"framework_overhead": 400 * 2**20, "total": 1000 * 2**20}
    assert need_bytes(lines) == int(1000 * 2**20 + MARGIN * 600 * 2**20 + RUN_ALLOWANCE)
    more_framework = {"framework_overhead": 900 * 2**20, "total": 1000 * 2**20}
    assert need_bytes(more_framework) < need_bytes(lines)  # measured overhead carries no margin


def test_longest_sequence_padded_or_the_longest_example():
    from leantrain.methods import get_task

    data = SimpleNamespace(train={"length": [5, 41, 17]}, task=get_task("text-classification"))
    assert longest_sequence(resolve(None, ["data.batching=grouped"]), data) == 41
    assert longest_sequence(resolve(None, ["data.batching=padded", "data.max_length=64"]), data) == 64


def test_an_online_methods_rows_are_its_longest_prompt_and_the_tokens_it_generates():
    """GRPO trains on each prompt followed by up to grpo.max_new_tokens completion tokens: the memory is sized for
    both (leantrain plan priced the prompt alone before)."""
    from leantrain.config import resolve as resolved
    from leantrain.methods import get_task

    cfg = resolved(None, ["model.task=grpo", "grpo.rewards=[numeric:answer]", "grpo.max_new_tokens=256"])
    data = SimpleNamespace(train={"length": [5, 95, 17]}, task=get_task("grpo").configured(cfg))
    assert longest_sequence(cfg, data) == 95 + 256


def test_cpu_default_budget_is_a_share_of_the_ram_per_local_process(monkeypatch):
    one, source = default_budget(torch.device("cpu"), local=1)
    assert one > 0 and f"{RAM_SHARE:.0%} of" in source and "/ 1 local process(es)" in source
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    four, source = default_budget(torch.device("cpu"))
    assert "/ 4 local process(es)" in source
    assert four == pytest.approx(one / 4, rel=0.2)  # RAM available moves a little between the two readings
