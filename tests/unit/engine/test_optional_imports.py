"""Optional back-ends are imported only by the runs that ask for them: a plain classifier run on CPU never imports
bitsandbytes (whose CPU kernel probe prints an error about a package the run does not use), peft, nor trackio (a
tracker it did not ask for)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers import REPO, write_rows

RUN = """
import sys
from leantrain.cli import main
status = main(["train", "model.name={model}", "data.train={data}", "train.max_steps=1", "train.batch_size=4",
               "checkpoint.every_steps=0", "report.plots=false", "output_dir={out}"])
print("imported:", sorted(m for m in ("bitsandbytes", "peft", "trackio") if m in sys.modules), "status", status)
"""


def test_a_plain_classifier_run_imports_no_optional_backend(tmp_path, tiny_bert):
    rows = [{"text": f"{'good' if i % 2 else 'bad'} film {i}", "label": ["neg", "pos"][i % 2]} for i in range(16)]
    data = write_rows(tmp_path / "train.csv", rows)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", RUN.format(model=tiny_bert, data=data, out=tmp_path / "run")],
                         capture_output=True, text=True, env=env, timeout=300)
    assert "imported: [] status 0" in out.stdout, out.stdout[-2000:] + out.stderr[-3000:]
    assert "kernels" not in out.stderr and "gemm_4bit" not in out.stderr
