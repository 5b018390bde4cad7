"""Token counting for workloads: the served model's tokenizer, light, or a stand-in.

Workloads need token counts (filters, exact prompt lengths, prefix reuse) but a benchmark
client must start fast and stay light, so ``transformers`` (which imports torch) is only a
fallback: a ``tokenizer.json`` folder is read with ``tokenizers`` and its chat template
rendered with ``jinja2``, giving the same ids.
"""

from __future__ import annotations

import json
import os
import random
import re
import zlib
from pathlib import Path
from typing import Any, Sequence


class Tokenizer:
    """Token counting for workloads: the served model's tokenizer, or a whitespace stand-in.

    The stand-in is only for servers whose tokenizer is not available locally; counts are
    then approximate (one word = one token) and the results say so.
    """

    def __init__(self, hf: Any | None = None, name: str = "whitespace"):
        self.hf = hf
        self.name = name
        self._words: list[str] | None = None

    @classmethod
    def load(cls, model: str | None, tokenizer: str | None = None) -> "Tokenizer":
        """``tokenizer`` (a local folder) wins; else the model name if it resolves locally."""
        path = tokenizer
        if path is None and model:
            try:
                from reference_server.models import resolve_model
                spec = resolve_model(model, prepare=False)
                path = spec.path if os.path.isdir(spec.path) else None
            except Exception:
                path = model if os.path.isdir(model) else None
        if path is None:
            return cls()
        try:
            return cls(LightTokenizer(Path(path)), name=str(path))
        except Exception:  # no tokenizer.json, an unusual template: the full library
            from transformers import AutoTokenizer
            return cls(AutoTokenizer.from_pretrained(path, local_files_only=True), name=str(path))

    def encode(self, text: str) -> list[int]:
        if self.hf is None:
            return [zlib.crc32(w.encode()) for w in text.split()]  # stable across processes
        return self.hf.encode(text, add_special_tokens=False)

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def prompt_ids(self, req: Any) -> list[int]:
        """The tokens the server will prefill (chat template applied for chat requests), for a
        ``workloads.Request`` (its ``prompt``, else its ``messages``)."""
        if req.prompt is not None:
            return self.encode(req.prompt)
        if self.hf is None or getattr(self.hf, "chat_template", None) is None:
            return [t for m in req.messages or []
                    for t in self.encode(f"{m['role']}: {m['content']}")]
        ids = self.hf.apply_chat_template(req.messages, tokenize=True, add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def words(self) -> list[str]:
        """Words that are one token each (with their leading space), for synthetic text."""
        if self._words is None:
            if self.hf is None:
                self._words = _FALLBACK_WORDS
            else:
                vocab = self.hf.get_vocab()
                words = sorted(k[1:] for k in vocab if re.fullmatch("Ġ[a-z]{3,10}", k))
                self._words = words or _FALLBACK_WORDS
        return self._words


class LightTokenizer:
    """The parts of a Hugging Face tokenizer the workloads use, from ``tokenizers`` + ``jinja2``.

    Importing ``transformers`` costs seconds (it pulls in torch); a benchmark client should
    start fast and stay light. Same token ids as ``transformers`` for a ``tokenizer.json``
    folder; the chat template is rendered the way ``apply_chat_template`` renders it.
    """

    def __init__(self, folder: Path):
        import jinja2
        import jinja2.sandbox
        from tokenizers import Tokenizer as HFTokenizer
        self.tk = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template = cfg.get("chat_template")
        if template is None and (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template = template
        tok = lambda v: v.get("content") if isinstance(v, dict) else v  # noqa: E731
        self.special = {"bos_token": tok(cfg.get("bos_token")) or "",
                        "eos_token": tok(cfg.get("eos_token")) or ""}
        self._template = None
        if template is not None:
            env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(template)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self.tk.get_vocab()

    def apply_chat_template(self, messages: list[dict], tokenize: bool = True,
                            add_generation_prompt: bool = True) -> list[int] | str:
        text = self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                     **self.special)
        return self.encode(text) if tokenize else text


def _raise(msg: str) -> None:
    raise ValueError(msg)


_FALLBACK_WORDS = ("data model server token cache batch queue request reply stream latency "
                   "kernel memory layer prefix decode prefill thread agent tool file search "
                   "result error value table index graph node edge block page").split()


def filler(tok: Tokenizer, rng: random.Random, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of seeded word salad (exact with a real BPE tokenizer)."""
    words = tok.words()
    return " ".join(rng.choice(words) for _ in range(max(n_tokens, 0)))


def exact_filler(tok: Tokenizer, rng: random.Random, n_tokens: int) -> str:
    """Text that tokenizes to exactly ``n_tokens`` tokens (as a completions prompt)."""
    text = filler(tok, rng, n_tokens + 8)
    if tok.hf is None:
        return " ".join(text.split()[:n_tokens])
    ids = tok.encode(text)[:n_tokens]
    return tok.hf.decode(ids)
