"""The Ollama ``Modelfile`` written beside a GGUF file: ``FROM`` the file, a ``TEMPLATE`` in Ollama's Go template
language for the chat formats it can be sure of (ChatML, as SmolLM2 / Qwen use it; Llama 3's header format), the
stop tokens, the template's default system prompt as ``SYSTEM`` (SmolLM2's adds one when a conversation has none;
Ollama's TEMPLATE shows ``.System`` only when there is one), and ``PARAMETER`` defaults (the context length, the
temperature and top_p of generation_config.json).

A chat template of another shape is not translated (Jinja is not Go): the Modelfile then has no TEMPLATE, and Ollama
takes the one it recognises from the file's ``tokenizer.chat_template``. A model without a chat template (a base
model) gets the raw prompt: ``{{ .Prompt }}``."""

from __future__ import annotations

CHATML = """{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}{{- range .Messages }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}<|im_start|>assistant
"""

LLAMA3 = """{{- if .System }}<|start_header_id|>system<|end_header_id|>

{{ .System }}<|eot_id|>{{ end }}{{- range .Messages }}<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>{{ end }}<|start_header_id|>assistant<|end_header_id|>

"""


def chat_format(template: str | None) -> str:
    """``chatml``, ``llama3``, ``other`` or ``none`` (no chat template)."""
    if not template:
        return "none"
    if "<|im_start|>" in template:
        return "chatml"
    if "<|start_header_id|>" in template:
        return "llama3"
    return "other"


SYSTEM_TURN = {"chatml": ("<|im_start|>system\n", "<|im_end|>"),
               "llama3": ("<|start_header_id|>system<|end_header_id|>\n\n", "<|eot_id|>")}


def default_system(template: str, kind: str) -> str | None:
    """The system message the chat template adds to a conversation that has none (rendered by transformers' own chat
    template renderer), or None: none added, a format without a known system turn, or a template that does not
    render without a tokenizer's extra context."""
    if kind not in SYSTEM_TURN:
        return None
    from transformers.utils.chat_template_utils import render_jinja_template  # lazy: heavy

    try:
        (text,), _ = render_jinja_template([[{"role": "user", "content": "hi"}]], chat_template=template,
                                           add_generation_prompt=True, bos_token="", eos_token="")
    except Exception:  # noqa: BLE001 - a template that needs more than messages: no default is claimed
        return None
    start, end = SYSTEM_TURN[kind]
    _, found, rest = text.partition(start)
    system, closed, _ = rest.partition(end)
    return system if found and closed else None


def modelfile(gguf_name: str, template: str | None, eos: str | None, context: int,
              generation: dict | None = None) -> str:
    """The text of a Modelfile for the GGUF file ``gguf_name`` (a path relative to the Modelfile's folder)."""
    kind = chat_format(template)
    lines = [f"# Ollama: ollama create NAME -f Modelfile && ollama run NAME   (written by leantrain export)",
             f"FROM ./{gguf_name}"]
    if kind == "chatml":
        lines.append(f'TEMPLATE """{CHATML}"""')
    elif kind == "llama3":
        lines.append(f'TEMPLATE """{LLAMA3}"""')
    elif kind == "none":
        lines.append('TEMPLATE """{{ .Prompt }}"""')
    else:
        lines.append("# no TEMPLATE: Ollama reads the chat template stored in the GGUF file")
    if (system := default_system(template, kind) if template else None) is not None:
        lines.append(f'SYSTEM """{system}"""')
    stops = {"chatml": ["<|im_end|>"], "llama3": ["<|eot_id|>"]}.get(kind, [])
    if eos and eos not in stops:
        stops.append(eos)
    lines += [f'PARAMETER stop "{s}"' for s in stops]
    lines.append(f"PARAMETER num_ctx {min(context, 8192)}")
    for key in ("temperature", "top_p", "top_k"):
        value = (generation or {}).get(key)
        if value is not None and (generation or {}).get("do_sample", True):
            lines.append(f"PARAMETER {key} {value}")
    return "\n".join(lines) + "\n"
