"""leantrain's GGUF export run in llama.cpp itself (``llama-cpp-python``), against transformers on the source folder.

For each --outtype the model is exported with leantrain's own writer, loaded with ``llama_cpp.Llama`` and compared on
the SAME token ids (the folder's tokenizer):

- tokens: whether llama.cpp's own tokenizer (from the file's ``tokenizer.ggml.*`` keys) gives the folder's ids for a
  few texts, the chat template rendered included;
- perplexity over the first --tokens tokens of a text in windows of --window, from llama.cpp's logits and from
  transformers' (fp32) logits, and the largest logit difference as a fraction of the largest logit;
- --new-tokens greedy tokens per prompt (EOS suppressed on both sides), and where they part: a near-tie when the
  source's margin between the two tokens is within the rounding (``check.py``'s bound), otherwise a real difference;
- a chat answer (4 x --new-tokens at most) from ``create_chat_completion`` (the stored template, the stop at EOS)
  against transformers' greedy answer on the folder's template.

llama.cpp runs with its defaults (f16 KV cache: --kv f32 keeps keys and values in f32) except that its extra CPU
buffer types are off unless --extra-buffers (``plain_cpu_buffers``: its AMX kernel crashes on this machine).

    # builds llama.cpp (the `llamacpp` extra): 140 objects, 20 minutes on 2 shared cores at nice 19 (mtmd skipped)
    CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
        CMAKE_BUILD_PARALLEL_LEVEL=2 nice -n 19 pip install llama-cpp-python -c constraints.txt
    flock /tmp/leantrain-cpu.lock python -m benchmarks.export.gguf_llamacpp smollm2-135m --out /tmp/gguf-llamacpp
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import time
from importlib.metadata import version
from pathlib import Path

TEXT = "/work/shared/data/tinyshakespeare/valid.txt"
CHAT = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}]


@contextlib.contextmanager
def plain_cpu_buffers(enabled: bool):
    """Within it, ``llama_cpp.Llama`` loads weights without llama.cpp's extra CPU buffer types (``use_extra_bufts``:
    AMX and repacked layouts), so quantised matrices run through ggml's plain dot products. llama.cpp's AMX kernel
    (``ggml_backend_amx_mul_mat``) segfaults on this machine's Xeon with Q8_0 / Q4_1 weights, llama.cpp's own
    quantisation included (llama.cpp #20824, #26954); the Llama class takes no argument for it, so its call to
    ``llama_model_default_params`` is wrapped."""
    import llama_cpp.llama as module

    default = module.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    if enabled:
        module.llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        module.llama_cpp.llama_model_default_params = default


def nll(logits, ids) -> tuple[float, int]:  # noqa: ANN001 - float32 logits (n, vocab), ids (n,)
    """The summed next-token negative log-likelihood of ``ids[1:]`` under ``logits[:-1]``, and its token count."""
    import torch

    loss = torch.nn.functional.cross_entropy(torch.as_tensor(logits[:-1]).float(), torch.as_tensor(ids[1:]),
                                             reduction="sum")
    return loss.item(), len(ids) - 1


def llama_logits(llm, ids: list[int]):  # noqa: ANN001 - a llama_cpp.Llama made with logits_all=True
    """llama.cpp's logits at every position of ``ids`` (a fresh context)."""
    import numpy as np

    llm.reset()
    llm.eval(ids)
    return np.array(llm.scores[: len(ids)], dtype=np.float32)


def llama_greedy(llm, ids: list[int], n: int, eos: int | None) -> list[int]:  # noqa: ANN001
    """``n`` greedy tokens from llama.cpp's logits after ``ids``, EOS not allowed (as ``check.greedy_tokens``)."""
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        logits = llm.scores[llm.n_tokens - 1].copy()
        if eos is not None:
            logits[eos] = -math.inf
        out.append(int(logits.argmax()))
        llm.eval([out[-1]])
    return out


def tokenizer_rows(llm, tokenizer, texts: dict[str, str]) -> list[dict]:  # noqa: ANN001
    """Per text: whether llama.cpp's tokenizer (adding BOS as the file says, special tokens parsed) gives the folder's
    ids, and the first place they differ."""
    rows = []
    for name, text in texts.items():
        mine = tokenizer(text)["input_ids"]
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        rows.append({"text": name, "tokens": len(mine), "same": mine == theirs,
                     **({} if mine == theirs else {"first_diff": at, "hf": mine[at:at + 5], "llama": theirs[at:at + 5]})})
    return rows


def perplexities(model, llm, ids: list[int], window: int) -> dict:  # noqa: ANN001
    """Perplexity from transformers and from llama.cpp over ``ids`` in windows, and the largest logit difference."""
    import torch

    hf_sum = ll_sum = count = 0.0
    max_diff = scale = 0.0
    for start in range(0, len(ids) - 1, window):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        with torch.no_grad():
            a = model(torch.tensor([chunk])).logits[0]
        b = torch.from_numpy(llama_logits(llm, chunk))
        (s1, n), (s2, _) = nll(a, chunk), nll(b, chunk)
        hf_sum, ll_sum, count = hf_sum + s1, ll_sum + s2, count + n
        max_diff, scale = max(max_diff, (a - b).abs().max().item()), max(scale, a.abs().max().item())
    hf, ll = math.exp(hf_sum / count), math.exp(ll_sum / count)
    return {"ppl_hf": round(hf, 4), "ppl_llama": round(ll, 4), "ppl_ratio": round(ll / hf, 5),
            "scored_tokens": int(count), "max_logit_diff": round(max_diff, 4), "relative": f"{max_diff / scale:.2e}",
            "scale": scale}


def greedy_rows(model, tokenizer, llm, outtype: str, scale: float, n: int) -> list[dict]:  # noqa: ANN001
    """Greedy tokens per prompt on both sides; where they part, the source's margin and whether it is a near-tie."""
    import torch

    from leantrain.modeling.gguf_export.check import PROMPTS, TOLERANCES, greedy_tokens

    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    bound = 2 * TOLERANCES[outtype] * scale  # how far the rounding may move a logit gap (check.py)
    rows = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        mine, scores = greedy_tokens(model, torch.tensor([ids]), n, pad)
        theirs = llama_greedy(llm, ids, n, eos)
        agree = next((i for i, (m, t) in enumerate(zip(mine, theirs)) if m != t), n)
        row = {"prompt": prompt, "agree": f"{agree}/{n}", "text": tokenizer.decode(mine)}
        if agree < n:
            margin = (scores[agree][mine[agree]] - scores[agree][theirs[agree]]).item()
            row.update(parts_at=agree, hf=tokenizer.decode(mine[agree]), llama=tokenizer.decode(theirs[agree]),
                       hf_margin=round(margin, 4), near_tie=margin <= bound, llama_text=tokenizer.decode(theirs))
        rows.append(row)
    return rows


def chat_row(model, tokenizer, llm, n: int) -> dict:  # noqa: ANN001
    """CHAT answered greedily, up to ``n`` tokens, by llama.cpp (``create_chat_completion``: its rendering of the
    file's chat template, stopping at the file's EOS) and by transformers (the folder's template, ``generate`` until
    EOS): the same answer or not, and why each stopped."""
    import torch

    out = llm.create_chat_completion(messages=CHAT, max_tokens=n, temperature=0.0)["choices"][0]
    prompt = tokenizer(tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True))["input_ids"]
    with torch.no_grad():
        new = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=n, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.eos_token_id)[0, len(prompt):].tolist()
    hf = tokenizer.decode(new, skip_special_tokens=True)
    hf_stop = "stop" if new[-1] == tokenizer.eos_token_id else "length"
    return {"same": out["message"]["content"] == hf and out["finish_reason"] == hf_stop, "hf": hf, "hf_stop": hf_stop,
            "llama": out["message"]["content"], "llama_stop": out["finish_reason"]}


def main() -> None:
    import llama_cpp
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from leantrain.commands.generate import model_folder
    from leantrain.modeling.gguf_export.check import PROMPTS
    from leantrain.modeling.gguf_export.source import open_source
    from leantrain.modeling.gguf_export.write import write_gguf

    p = argparse.ArgumentParser()
    p.add_argument("model", nargs="?", default="smollm2-135m", help="a preset, model folder or run folder")
    p.add_argument("--out", required=True)
    p.add_argument("--outtypes", default="f16,q8_0")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--extra-buffers", action="store_true",
                   help="let llama.cpp repack weights into its AMX / repack CPU buffers (segfaults here on Q8_0)")
    p.add_argument("--kv", choices=("f16", "f32"), default="f16",
                   help="llama.cpp's KV cache type (its default f16 rounds keys and values, even for an f32 file)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    print(json.dumps({"llama_cpp_python": llama_cpp.__version__, "torch": torch.__version__,
                      "transformers": transformers.__version__, "gguf": version("gguf")}), flush=True)
    folder = Path(model_folder(a.model))
    src = open_source(folder)
    tok = src.tokenizer
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok(Path(a.text).read_text(encoding="utf-8"))["input_ids"][: a.tokens]
    texts = {f"prompt {i}": prompt for i, prompt in enumerate(PROMPTS)}
    texts["shakespeare (first 2,000 chars)"] = Path(a.text).read_text(encoding="utf-8")[:2000]
    if tok.chat_template:
        texts["chat template rendered"] = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    kv = {"f16": llama_cpp.GGML_TYPE_F16, "f32": llama_cpp.GGML_TYPE_F32}[a.kv]
    for outtype in a.outtypes.split(","):
        path = Path(a.out) / f"{folder.name}.{outtype}.gguf"
        result = write_gguf(src, path, outtype, folder.name)
        start = time.perf_counter()
        with plain_cpu_buffers(not a.extra_buffers):
            llm = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=a.window, n_batch=a.window,
                                  n_threads=a.threads, type_k=kv, type_v=kv, verbose=False)
        row = {"outtype": outtype, "MiB": round(result.bytes / 2**20, 1), "export_s": round(result.seconds, 1),
               "pre": result.pre_tokenizer, "extra_buffers": a.extra_buffers, "kv": a.kv,
               "chat_template_same": llm.metadata.get("tokenizer.chat_template") == tok.chat_template,
               "tokenizer": tokenizer_rows(llm, tok, texts), **perplexities(model, llm, ids, a.window)}
        row["greedy"] = greedy_rows(model, tok, llm, outtype, row.pop("scale"), a.new_tokens)
        if tok.chat_template:
            row["chat"] = chat_row(model, tok, llm, 4 * a.new_tokens)
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row, ensure_ascii=False), flush=True)
        del llm


if __name__ == "__main__":
    main()
