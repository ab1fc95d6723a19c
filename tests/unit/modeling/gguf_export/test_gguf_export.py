"""``leantrain export --format gguf`` on a tiny random Llama (hidden 32, 2 layers) with a small byte-level BPE
tokenizer and a ChatML template: the file transformers reads back (``gguf_file=``) gives the source's logits (f32:
exactly, so the Q/K permutation is right) and token ids; the tokenizer keys, the chat template, the tensor types per
outtype, tied embeddings, a LoRA adapter folder merged first, the Modelfile, and the errors (exit 2) for a model or a
tokenizer llama.cpp cannot run. The pre-tokenizer name of GPT-2's real tokenizer comes from llama.cpp's hash table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from leantrain.cli import main
from leantrain.modeling.gguf_export.arch import permute_qk, unpermute_qk
from tests.helpers import CHATML, make_gpt2_tokenizer, make_tiny_chat_tokenizer, make_tiny_llama, make_tiny_lm_tokenizer

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory):
    return make_tiny_chat_tokenizer(tmp_path_factory.mktemp("tok") / "tok", chat_template=CHATML)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, chat_tok):
    return make_tiny_llama(tmp_path_factory.mktemp("llama") / "model", chat_tok)


def fields(path) -> dict:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}, \
        {t.name: t for t in reader.tensors}


def test_permute_is_llama_cpp_layout_and_invertible():
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)  # 2 heads of 8 rows
    p = permute_qk(w, 2)
    assert p[:, 0].tolist()[:8] == [0, 12, 3, 15, 6, 18, 9, 21]  # head 0: rows 0,4,1,5,2,6,3,7 interleaved
    assert np.array_equal(unpermute_qk(p, 2), w)


def test_f32_export_reads_back_exactly(tiny, tmp_path, capsys):
    out = tmp_path / "out" / "tiny.gguf"
    assert main(["export", str(tiny), "--format", "gguf", "--outtype", "f32", "--output", str(out), "--check",
                 "--check-tokens", "4"]) == 0
    text = capsys.readouterr().out
    assert "largest logit difference: 0 " in text and "tokenizer: the same token ids" in text
    assert "check passed" in text and text.count("greedy 4/4 tokens agree") == 3
    kv, tensors = fields(out)
    assert kv["general.architecture"] == "llama" and kv["general.file_type"] == 0
    assert kv["tokenizer.ggml.model"] == "gpt2" and kv["tokenizer.ggml.pre"] == "gpt-2"
    assert kv["tokenizer.chat_template"] == CHATML
    assert kv["tokenizer.ggml.eos_token_id"] == 0 and len(kv["tokenizer.ggml.tokens"]) == 320
    assert kv["tokenizer.ggml.tokens"][1] == "<|im_start|>" and kv["tokenizer.ggml.token_type"][1] == 3  # control
    assert len(kv["tokenizer.ggml.merges"]) > 0 and kv["llama.attention.head_count_kv"] == 2
    assert "output.weight" in tensors and not list(out.parent.glob(".*.tmp"))  # untied; no temporary left
    modelfile = (out.parent / "Modelfile").read_text()
    assert "FROM ./tiny.gguf" in modelfile and "<|im_start|>{{ .Role }}" in modelfile
    assert 'PARAMETER stop "<|im_end|>"' in modelfile


def test_q8_0_within_its_tolerance_and_types_per_tensor(tiny, tmp_path, capsys):
    assert main(["export", str(tiny), "--outtype", "q8_0", "--check", "--check-tokens", "4",
                 "--output", str(tmp_path / "m.gguf")]) == 0
    text = capsys.readouterr().out
    assert "tolerance for q8_0" in text and "check passed" in text
    _, tensors = fields(tmp_path / "m.gguf")
    Q = gguf.GGMLQuantizationType
    assert tensors["blk.0.attn_q.weight"].tensor_type == Q.Q8_0 and tensors["token_embd.weight"].tensor_type == Q.Q8_0
    assert tensors["blk.0.attn_norm.weight"].tensor_type == Q.F32 and tensors["output_norm.weight"].tensor_type == Q.F32


def test_tied_embeddings_write_no_output_layer(chat_tok, tmp_path, capsys):
    folder = make_tiny_llama(tmp_path / "tied", chat_tok, tie=True)
    assert main(["export", str(folder), "--outtype", "bf16", "--check", "--check-tokens", "2"]) == 0
    assert "check passed" in capsys.readouterr().out
    kv, tensors = fields(tmp_path / "tied.bf16.gguf")  # default: beside the folder
    assert "output.weight" not in tensors and kv["general.file_type"] == 32
    assert tensors["blk.1.ffn_down.weight"].tensor_type == gguf.GGMLQuantizationType.BF16


def test_lora_adapter_folder_is_merged_first(tiny, tmp_path, capsys):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    torch.manual_seed(1)
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["v_proj"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    base.config.save_pretrained(adapter)
    AutoTokenizer.from_pretrained(tiny).save_pretrained(adapter)
    merged_v = peft_model.merge_and_unload().model.layers[0].self_attn.v_proj.weight.detach().numpy()
    assert main(["export", str(adapter), "--outtype", "f32", "--check", "--check-tokens", "2"]) == 0
    assert "check passed" in capsys.readouterr().out
    _, tensors = fields(tmp_path / "adapter.f32.gguf")
    written = np.asarray(tensors["blk.0.attn_v.weight"].data)
    original = AutoModelForCausalLM.from_pretrained(tiny).model.layers[0].self_attn.v_proj.weight.detach().numpy()
    assert np.array_equal(written, merged_v) and not np.allclose(written, original)


def test_unsupported_architecture_exits_2_naming_it(tiny_bert, tmp_path, capsys):
    assert main(["export", str(tiny_bert), "--output", str(tmp_path / "b.gguf")]) == 2
    err = capsys.readouterr().err
    assert "BertModel" in err and "supported: LlamaForCausalLM" in err
    assert not (tmp_path / "b.gguf").exists()


def test_word_level_tokenizer_exits_2(tmp_path, capsys):
    folder = make_tiny_llama(tmp_path / "m", make_tiny_lm_tokenizer(tmp_path / "tok"))
    assert main(["export", str(folder), "--output", str(tmp_path / "m.gguf")]) == 2
    assert "WordLevel tokenizer" in capsys.readouterr().err and not (tmp_path / "m.gguf").exists()


def test_gpt2_tokenizer_is_known_by_its_hash(tmp_path):
    from transformers import AutoTokenizer

    from leantrain.modeling.gguf_export.vocab import PRE_TOKENIZERS, pre_tokenizer_hash

    tok = AutoTokenizer.from_pretrained(make_gpt2_tokenizer(tmp_path / "gpt2"))
    assert PRE_TOKENIZERS[pre_tokenizer_hash(tok)] == "gpt-2"


def test_modelfile_per_chat_format():
    from leantrain.modeling.gguf_export.modelfile import modelfile

    llama3 = modelfile("m.gguf", "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>' }}", "<|end_of_text|>",
                       131072, {"do_sample": True, "temperature": 0.6, "top_p": 0.9})
    assert "<|start_header_id|>{{ .Role }}<|end_header_id|>" in llama3 and 'PARAMETER stop "<|eot_id|>"' in llama3
    assert "PARAMETER num_ctx 8192" in llama3 and "PARAMETER temperature 0.6" in llama3 and "top_p 0.9" in llama3
    base = modelfile("m.gguf", None, "</s>", 2048)
    assert 'TEMPLATE """{{ .Prompt }}"""' in base and 'PARAMETER stop "</s>"' in base and "temperature" not in base
    other = modelfile("m.gguf", "{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}", "</s>", 4096)
    assert "TEMPLATE" not in other.replace("no TEMPLATE", "") and "FROM ./m.gguf" in other


SMOLLM2_STYLE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                 "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
                 "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def test_modelfile_keeps_the_default_system_prompt_the_chat_template_adds():
    """SmolLM2's template adds a system turn to a conversation without one; Ollama's ChatML TEMPLATE shows a system
    turn only when .System is set, so the Modelfile sets it: the same prompt as transformers' without a system."""
    from leantrain.modeling.gguf_export.modelfile import modelfile

    assert 'SYSTEM """You are a helpful AI assistant"""' in modelfile("m.gguf", SMOLLM2_STYLE, "<|im_end|>", 2048)
    plain = SMOLLM2_STYLE.replace("{% if loop.first and messages[0]['role'] != 'system' %}", "{% if false %}")
    assert "SYSTEM" not in modelfile("m.gguf", plain, "<|im_end|>", 2048)


def test_qwen2_biases_and_unpermuted_rotary_read_back_exactly(chat_tok, tmp_path, capsys):
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(chat_tok)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "qwen")
    tok.save_pretrained(tmp_path / "qwen")
    assert main(["export", str(tmp_path / "qwen"), "--outtype", "f32", "--check", "--check-tokens", "2"]) == 0
    assert "largest logit difference: 0 " in capsys.readouterr().out
    kv, tensors = fields(tmp_path / "qwen.f32.gguf")
    assert kv["general.architecture"] == "qwen2" and "blk.0.attn_q.bias" in tensors


def byte_fallback_tokenizer(folder):
    """A Llama-2-style BPE (▁ for spaces, byte fallback, BOS added) trained on a small corpus."""
    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    from tests.helpers import CHAT_CORPUS

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator([CHAT_CORPUS] * 4, trainer=trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                                           show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(
        folder)
    return folder


def test_byte_fallback_vocabulary_is_llama_with_byte_tokens(tmp_path, capsys):
    folder = make_tiny_llama(tmp_path / "spm", byte_fallback_tokenizer(tmp_path / "tok"))
    assert main(["export", str(folder), "--outtype", "f32", "--check", "--check-tokens", "2"]) == 0
    assert "tokenizer: the same token ids" in capsys.readouterr().out
    kv, _ = fields(tmp_path / "spm.f32.gguf")
    assert kv["tokenizer.ggml.model"] == "llama" and kv["tokenizer.ggml.pre"] == "default"
    assert kv["tokenizer.ggml.add_bos_token"] is True and kv["tokenizer.ggml.bos_token_id"] == 1
    assert kv["tokenizer.ggml.token_type"][3] == gguf.TokenType.BYTE  # <0x00>
