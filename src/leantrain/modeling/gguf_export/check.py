"""``--check``: the written GGUF file read back by transformers (``gguf_file=``) and compared with the source model.

Three things are compared on a few prompts: the token ids (the file's tokenizer, rebuilt by transformers from the
``tokenizer.ggml.*`` keys, against the folder's), the logits of every position (the largest absolute difference, as a
fraction of the source's largest absolute logit, within ``TOLERANCES[outtype]``), and ``new_tokens`` greedy tokens
per prompt. f32 is exact to float error; f16 / bf16 / q8_0 round the weights, so greedy decoding may part where the
source's two best tokens are closer than the rounding moves them: such a parting is reported and accepted, any other
fails the check."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# largest |logit difference| / largest |source logit|, per outtype: f16 / bf16 about 10x the tiny fp32 test Llama's
# (SmolLM2's bf16 weights convert exactly), q8_0 about 3x SmolLM2-135M's 3.07e-2 (benchmarks/results/gguf-export.md).
TOLERANCES = {"f32": 1e-5, "f16": 5e-3, "bf16": 3e-2, "q8_0": 1e-1}
PROMPTS = ("The capital of France is", "Once upon a time, there was a", "def add(a, b):\n    return")


@dataclass
class Greedy:
    prompt: str
    agree: int  # tokens equal from the start
    total: int
    near_tie: bool = False  # parted where the source's margin was within the rounding


@dataclass
class CheckResult:
    outtype: str
    max_diff: float = 0.0
    scale: float = 0.0
    tokens_same: bool = True
    unreadable: str | None = None  # why transformers could not read the file back
    token_problems: list[str] = field(default_factory=list)
    greedy: list[Greedy] = field(default_factory=list)

    @property
    def relative(self) -> float:
        return self.max_diff / self.scale if self.scale else 0.0

    @property
    def tolerance(self) -> float:
        return TOLERANCES[self.outtype]

    @property
    def passed(self) -> bool:
        return (self.unreadable is None and self.tokens_same and self.relative <= self.tolerance
                and all(g.agree == g.total or g.near_tie for g in self.greedy))

    def lines(self) -> list[str]:
        if self.unreadable is not None:
            return [f"transformers could not read the file back: {self.unreadable}", "check FAILED"]
        out = [f"largest logit difference: {self.max_diff:.3g} ({self.relative:.2e} of the largest logit "
               f"{self.scale:.3g}; tolerance for {self.outtype}: {self.tolerance:.0e})",
               "tokenizer: the same token ids" if self.tokens_same else "tokenizer: DIFFERENT token ids"]
        out += [f"  {p}" for p in self.token_problems]
        for g in self.greedy:
            why = "" if g.agree == g.total else (" (then a near-tie: the source's top two were within the rounding)"
                                                 if g.near_tie else " (then a real difference)")
            out.append(f"greedy {g.agree}/{g.total} tokens agree{why}: {g.prompt!r}")
        out.append("check passed" if self.passed else "check FAILED")
        return out


def load_gguf_model(path: Path):
    """The GGUF file as a transformers causal LM (dequantised to float32) and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def greedy_tokens(model, ids, n: int, pad: int):  # noqa: ANN001
    """``n`` greedy tokens after ``ids`` (EOS not allowed to end early) and the scores at each step."""
    out = model.generate(ids, attention_mask=ids.new_ones(ids.shape), max_new_tokens=n, min_new_tokens=n,
                         do_sample=False, output_scores=True, return_dict_in_generate=True, pad_token_id=pad)
    return out.sequences[0, ids.shape[1]:].tolist(), [s[0] for s in out.scores]


def compare(model, tokenizer, path: Path, outtype: str, prompts=PROMPTS, new_tokens: int = 8) -> CheckResult:  # noqa: ANN001
    """``model`` / ``tokenizer`` (the source) against the GGUF file at ``path``."""
    import torch

    result = CheckResult(outtype)
    try:
        gmodel, gtok = load_gguf_model(path)
    except Exception as e:  # noqa: BLE001 - transformers' GGUF reader has gaps (e.g. Qwen3 with head_dim != 128)
        result.unreadable = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        return result
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = model.float().eval()
    with torch.no_grad():
        for prompt in prompts:
            ids, gids = tokenizer(prompt)["input_ids"], gtok(prompt)["input_ids"]
            if ids != gids:
                result.tokens_same = False
                result.token_problems.append(f"{prompt!r}: {ids} from the folder, {gids} from the file")
            x = torch.tensor([ids])
            a, b = model(x).logits, gmodel(x).logits
            result.max_diff = max(result.max_diff, (a - b).abs().max().item())
            result.scale = max(result.scale, a.abs().max().item())
        bound = 2 * TOLERANCES[outtype] * result.scale  # how far the rounding may move a logit gap
        for prompt in prompts:
            x = torch.tensor([tokenizer(prompt)["input_ids"]])
            mine, scores = greedy_tokens(model, x, new_tokens, pad)
            theirs, _ = greedy_tokens(gmodel, x, new_tokens, pad)
            agree = next((i for i, (m, t) in enumerate(zip(mine, theirs)) if m != t), new_tokens)
            tie = agree < new_tokens and (scores[agree][mine[agree]] - scores[agree][theirs[agree]]).item() <= bound
            result.greedy.append(Greedy(prompt, agree, new_tokens, tie))
    return result
