"""Batch widths: on a CPU the collators round a batch's sequence length to one of at most four widths an octave
(``padded_width``), so oneDNN's per-shape kernels are reused; on CUDA to a multiple of 8. The padding they add is
masked: that it changes no loss or gradient is checked in tests/unit/methods/test_preference.py
(``test_the_padding_of_bucketed_widths_changes_no_loss_or_gradient``)."""

from __future__ import annotations

from leantrain.data.lm.collate import LMCollator
from leantrain.data.lm.preference_collate import PairCollator
from leantrain.data.text import TextCollator, pad_multiple, padded_width


def test_widths_are_few_per_octave_and_cost_at_most_a_quarter_more():
    widths = {w: padded_width(w) for w in range(1, 4097)}
    for w, p in widths.items():
        assert w <= p <= 1.25 * w and padded_width(p) == p
        assert p - w < 16  # the rounding never exceeds 16 positions
    for k in range(7):  # up to 128: at most four widths in (2^k, 2^(k+1)]
        assert len({widths[w] for w in range(2 ** k + 1, 2 ** (k + 1) + 1)}) <= 4
    assert [padded_width(w) for w in (7, 13, 37, 100, 300)] == [7, 14, 40, 112, 304]
    assert padded_width(37, 8) == 40 and padded_width(40, 8) == 40 and padded_width(37, 1) == 37


def test_every_collator_rounds_the_same_way_and_cuda_keeps_multiples_of_8():
    assert pad_multiple("cuda") == 8 and pad_multiple("cpu") is None
    ids = [list(range(1, 38)), [1, 2]]
    text = TextCollator(0)([{"input_ids": i, "attention_mask": [1] * len(i), "labels": 0} for i in ids])
    lm = LMCollator(0)([{"input_ids": i, "labels": i} for i in ids])
    pairs = PairCollator(0)([{"chosen_input_ids": ids[0], "chosen_labels": ids[0], "rejected_input_ids": ids[1],
                              "rejected_labels": ids[1]}])
    assert text["input_ids"].shape[1] == lm["input_ids"].shape[1] == pairs["input_ids"].shape[1] == 40
    assert TextCollator(0, pad_to=37)([{"input_ids": ids[1], "attention_mask": [1, 1], "labels": 0}])[
        "input_ids"].shape == (1, 37)  # data.batching=padded pads to max_length exactly
    assert LMCollator(0, multiple_of=8)([{"input_ids": ids[0], "labels": ids[0]}])["input_ids"].shape == (1, 40)


def test_a_bidirectional_classifier_sees_the_same_inputs_through_the_wider_batch():
    """BERT attends both ways, so the padding is only invisible through the attention mask: the logits of a batch
    at its exact width and at the CPU's rounded width are equal (fp32, SDPA)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=32)).eval()
    rows = [{"input_ids": list(range(2, 39)), "attention_mask": [1] * 37, "labels": 0},
            {"input_ids": [5, 6, 7], "attention_mask": [1] * 3, "labels": 1}]
    exact, wide = TextCollator(0, multiple_of=1)(rows), TextCollator(0)(rows)
    assert exact["input_ids"].shape[1] == 37 and wide["input_ids"].shape[1] == 40
    with torch.no_grad():
        a, b = (model(input_ids=x["input_ids"], attention_mask=x["attention_mask"]).logits for x in (exact, wide))
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
