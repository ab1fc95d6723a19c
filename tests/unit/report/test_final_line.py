"""The last line of a run: what the eval ran on (examples / blocks / packed blocks of examples) and the speed in
the task's unit."""

from leantrain.report.final_line import final_line, speed_text


def _summary(data: dict, unit: str) -> dict:
    return {"eval": {"loss": 1.25, "samples": 9}, "output_dir": "runs/x", "data": data, "efficiency": {"precision": "bf16"},
            "train": {"steps": 6, "samples_per_second": 0.04, "tokens_per_second": 1234.5, "speed_unit": unit}}


def test_packed_language_model_line_counts_blocks_of_examples_and_tokens_per_second():
    line = final_line("eval loss: 1.2500", _summary({"eval_row_kind": "blocks", "eval_examples": 20}, "tokens"),
                      with_loss=False)
    assert line == "eval loss: 1.2500 on 9 blocks (of 20 examples) in bf16  (6 steps, 1,234 tokens/s) -> runs/x"


def test_classifier_line_counts_examples_and_samples_per_second():
    line = final_line("eval accuracy: 0.5", _summary({"eval_row_kind": "examples"}, "samples"), with_loss=True)
    assert line == "eval accuracy: 0.5, loss 1.2500 on 9 examples in bf16  (6 steps, 0.0 samples/s) -> runs/x"
    assert speed_text({"samples_per_second": 3.0}) == "3.0 samples/s"  # an older summary.json: samples/s
