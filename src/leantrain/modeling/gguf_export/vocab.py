"""The tokenizer in GGUF metadata (``tokenizer.ggml.*``, ``tokenizer.chat_template``), as llama.cpp reads it.

Two vocabularies: a byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen: ``tokenizer.ggml.model=gpt2`` with its merges and
the name of its pre-tokenizer, ``tokenizer.ggml.pre``) and a SentencePiece-style BPE with byte fallback (Llama 2,
Mistral: ``llama``). llama.cpp splits text before BPE with a regex it picks by ``tokenizer.ggml.pre``; a wrong name
mis-tokenises silently (llama.cpp #8568 hit SmolLM), so the name is found as llama.cpp's converter finds it: the
sha256 of the token ids of one fixed text (``PRE_TEXT``), looked up in ``PRE_TOKENIZERS``. A tokenizer of its own
(another vocabulary) whose tokenizer.json splits with GPT-2's own ByteLevel regex alone is ``gpt-2`` by construction;
any other exits 2 with the hash rather than guess. Special token ids, whether to add BOS, merges and the chat template
come from the folder through gguf's ``SpecialVocab``."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from leantrain.errors import UserError

# The text llama.cpp's convert_hf_to_gguf.py encodes to tell pre-tokenizers apart (get_vocab_base_pre).
PRE_TEXT = ("\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ 🦙🦙 "
            "3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
            "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
            "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL")

# sha256(str(token ids of PRE_TEXT)) -> tokenizer.ggml.pre, from llama.cpp's table (the families leantrain exports).
PRE_TOKENIZERS = {
    "0ef9807a4087ebef797fc749390439009c3b9eda9ad1a097abbe738f486c01e5": "llama-bpe",  # Meta-Llama-3-8B
    "3ce83efda5659b07b1ad37ca97ca5797ea4285d9b9ab0dc679e4a720c9da7454": "gpt-2",  # openai-community/gpt2
    "855059429035d75a914d1eda9f10a876752e281a054a7a3d421ef0533e5b6249": "smollm",  # HuggingFaceTB/SmolLM-135M
    "e636dc30a262dcc0d8c323492e32ae2b70728f4df7dfe9737d9f920a282b8aea": "qwen2",  # Qwen/Qwen1.5-7B
    "b3f499bb4255f8ca19fccd664443283318f2fd2414d5e0b040fbdd0cc195d6c5": "deepseek-r1-qwen",
    "63b97e4253352e6f357cc59ea5b583e3a680eaeaf2632188c2b952de2588485e": "tekken",  # Mistral-Nemo-Base-2407
    "049ecf7629871e3041641907f3de7c733e4dbfdc736f57d882ba0b0845599754": "deepseek-llm",
    "347715f544604f9118bb75ed199f68779f423cabb20db6de6f31b908d04d7821": "deepseek-coder",
    "35d91631860c815f952d711435f48d356ebac988362536bed955d43bfa436e34": "starcoder",  # bigcode/starcoder2-3b
}


@dataclass
class GgufVocab:
    """What the file says about the tokenizer: its model (gpt2 / llama), pre-tokenizer, tokens and their types
    (and scores for llama), padded to the model's vocabulary size."""

    model: str
    pre: str
    tokens: list[str]
    types: list[int]
    scores: list[float] | None = None


def pre_tokenizer_hash(tokenizer) -> str:  # noqa: ANN001 - a transformers tokenizer
    return hashlib.sha256(str(tokenizer.encode(PRE_TEXT)).encode()).hexdigest()


def tokenizer_kind(folder: Path) -> str:
    """``gpt2`` (byte-level BPE) or ``llama`` (BPE with byte fallback) from tokenizer.json; exit 2 for any other."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UserError(f"{folder}: no tokenizer.json; GGUF export needs the fast tokenizer file in the model folder")
    model = json.loads(path.read_text(encoding="utf-8")).get("model", {})
    if model.get("type") != "BPE":
        raise UserError(f"{path}: a {model.get('type')} tokenizer; llama.cpp runs BPE vocabularies (byte-level as in "
                        "GPT-2 / Llama 3 / SmolLM / Qwen, or with byte fallback as in Llama 2 / Mistral)")
    return "llama" if model.get("byte_fallback") else "gpt2"


def gpt2_split(folder: Path) -> bool:
    """The tokenizer.json pre-tokenizer is one ByteLevel step with GPT-2's regex and no prefix space: llama.cpp's
    ``gpt-2`` split, whatever the vocabulary."""
    pre = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("pre_tokenizer") or {}
    if pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space", False)


def read_vocab(folder: Path, tokenizer, n_vocab: int) -> GgufVocab:  # noqa: ANN001
    """The tokens of ``folder``'s tokenizer in GGUF form, ``n_vocab`` of them (the embedding's rows; ids without a
    token become unused ``[PAD{i}]``)."""
    import gguf  # lazy: the optional gguf package

    if tokenizer_kind(folder) == "llama":
        hf = gguf.LlamaHfVocab(folder)
        rows = list(hf.all_tokens())
        tokens, scores, types = [t.decode("utf-8") for t, _, _ in rows], [s for _, s, _ in rows], [int(k) for _, _, k in rows]
        pad = range(len(tokens), n_vocab)
        return GgufVocab("llama", "default", tokens + [f"[PAD{i}]" for i in pad],
                         types + [int(gguf.TokenType.UNUSED)] * len(pad), scores + [-1000.0] * len(pad))
    digest = pre_tokenizer_hash(tokenizer)
    pre = PRE_TOKENIZERS.get(digest) or ("gpt-2" if gpt2_split(folder) else None)
    if pre is None:
        raise UserError(f"{folder}: llama.cpp does not know this tokenizer's pre-tokenizer (hash {digest}); known: "
                        f"{', '.join(sorted(set(PRE_TOKENIZERS.values())))}. Writing another name would make "
                        "llama.cpp split text differently from transformers")
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(int(gguf.TokenType.UNUSED))
            continue
        tokens.append(by_id[i])
        if i in added:
            types.append(int(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED))
        else:
            types.append(int(gguf.TokenType.NORMAL))
    return GgufVocab("gpt2", pre, tokens, types)


def add_vocab(writer, vocab: GgufVocab, folder: Path, tokenizer) -> None:  # noqa: ANN001 - a gguf.GGUFWriter
    """The tokenizer keys: model, pre-tokenizer, tokens, types (scores), then merges, special token ids and the chat
    template from the folder (gguf's ``SpecialVocab``, as llama.cpp's converter uses it), and add BOS / EOS as the
    tokenizer does."""
    import gguf  # lazy: the optional gguf package

    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.model == "gpt2":
        writer.add_add_space_prefix(False)
    special = gguf.SpecialVocab(folder, load_merges=vocab.model == "gpt2", n_vocab=len(vocab.tokens))
    special.add_special_token.update(added_specials(tokenizer))
    special.add_to_gguf(writer, quiet=True)


def added_specials(tokenizer) -> dict[str, bool]:  # noqa: ANN001
    """Whether encoding adds BOS at the start / EOS at the end, as the tokenizer does it (written explicitly: llama.cpp's
    default for a vocabulary type need not be the tokenizer's)."""
    ids = tokenizer("a")["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return {"bos": bos is not None and ids[:1] == [bos], "eos": eos is not None and len(ids) > 1 and ids[-1:] == [eos]}
