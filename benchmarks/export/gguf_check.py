"""GGUF export, measured: for each --outtype, the file size, the export time and what ``leantrain export --check``
compares (the largest logit difference as a fraction of the largest logit, token ids, greedy tokens) on a model
folder; the numbers behind ``modeling/gguf_export/check.py``'s TOLERANCES.

    flock /tmp/leantrain-cpu.lock python -m benchmarks.export.gguf_check smollm2-135m --out /tmp/gguf-bench
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from leantrain.commands.generate import model_folder
    from leantrain.modeling.gguf_export.check import compare
    from leantrain.modeling.gguf_export.source import open_source
    from leantrain.modeling.gguf_export.write import OUTTYPES, write_gguf

    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--out", required=True)
    p.add_argument("--outtypes", default=",".join(OUTTYPES))
    p.add_argument("--tokens", type=int, default=16)
    a = p.parse_args()
    folder = Path(model_folder(a.model))
    src = open_source(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    rows = []
    for outtype in a.outtypes.split(","):
        path = Path(a.out) / f"{folder.name}.{outtype}.gguf"
        result = write_gguf(src, path, outtype, folder.name)
        start = time.perf_counter()
        report = compare(model, src.tokenizer, path, outtype, new_tokens=a.tokens)
        rows.append({"outtype": outtype, "MiB": round(result.bytes / 2**20, 1), "export_s": round(result.seconds, 1),
                     "check_s": round(time.perf_counter() - start, 1), "max_diff": round(report.max_diff, 5),
                     "relative": f"{report.relative:.2e}", "tokens_same": report.tokens_same,
                     "greedy": [f"{g.agree}/{g.total}" + (" tie" if g.near_tie else "") for g in report.greedy],
                     "passed": report.passed})
        print(json.dumps(rows[-1]), flush=True)
    print("| outtype | MiB | export, s | largest logit diff | / largest logit | token ids | greedy agree | passed |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['outtype']} | {r['MiB']} | {r['export_s']} | {r['max_diff']} | {r['relative']} | "
              f"{'same' if r['tokens_same'] else 'DIFFERENT'} | {', '.join(r['greedy'])} | {r['passed']} |")


if __name__ == "__main__":
    main()
