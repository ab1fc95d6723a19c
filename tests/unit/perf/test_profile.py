"""efficiency.profile: a torch profiler trace and a table of where the step's time goes."""

from tests.helpers import write_rows
from leantrain import train


def test_profile_writes_trace_and_phase_table(tmp_path, tiny_bert):
    rows = [{"text": "good " * (1 + i % 7), "label": i % 2} for i in range(64)]
    data = write_rows(tmp_path / "train.csv", rows)
    out = tmp_path / "run"
    train(None, [f"model.name={tiny_bert}", f"data.train={data}", "train.batch_size=8", "train.max_steps=8",
                 "efficiency.profile=true", "efficiency.profile_steps=3", f"output_dir={out}", "report.plots=false"])
    phases, ops = (out / "profile" / "summary.txt").read_text().split("\n\n")
    ms = {line.split()[0]: float(line.split()[1]) for line in phases.splitlines()[1:]}
    assert set(ms) >= {"data", "forward", "backward", "optimizer", "logging", "communication"}
    assert ms["forward"] > 0 and ms["backward"] > 0 and ms["optimizer"] > 0 and ms["data"] > 0
    assert (out / "profile" / "trace.json").stat().st_size > 1000
    top = [line.split()[0] for line in ops.splitlines()[1:]]
    assert "aten::addmm" in top or "aten::mm" in top  # the operators that cost the most, matmuls among them
