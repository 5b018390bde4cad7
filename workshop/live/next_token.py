"""How one token is produced, seen from the client (notebook 0).

The server does not show its tokenizer over HTTP (the reference server relays only the
OpenAI routes), so the prompt's token ids come from the tokenizer files the server loaded,
and the notebook checks the count against the ``usage`` the server returns. The next-token
probabilities are the server's own: the ``logprobs`` of a completions request, which vLLM
computes from the raw logits, before temperature or top-p.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence


def load_tokenizer(session: Any):
    """The tokenizer of the served model: its folder when that is on this machine, else the
    name the server reports, as a hub id (downloaded by ``transformers`` unless offline)."""
    from transformers import AutoTokenizer

    names = [str(n) for n in (session.info.get("model_path"), session.model) if n and n != "?"]
    local = [n for n in names if os.path.isdir(n)]
    return AutoTokenizer.from_pretrained((local or names)[0])


def shown(piece: str) -> str:
    """A token's text made readable in a table or a plot: spaces and newlines visible."""
    return piece.replace(" ", "␣").replace("\n", "\\n").replace("\t", "\\t") or "(empty)"


def token_rows(tokenizer: Any, ids: Sequence[int]) -> list[dict]:
    """One row per token id: its position, the id, and the text it stands for."""
    return [{"position": i, "token id": t, "text": shown(tokenizer.decode([t]))}
            for i, t in enumerate(ids)]


def top_probabilities(top_logprobs: Mapping[str, float], k: int = 5) -> list[tuple[str, float]]:
    """``{token text: log-probability}`` -> the ``k`` most likely ``(text, probability)``.

    vLLM may return k + 1 entries (the sampled token is added when it is not among the top
    k); sorting and cutting gives the same k whatever the engine.
    """
    best = sorted(top_logprobs.items(), key=lambda kv: -kv[1])[:k]
    return [(text, math.exp(lp)) for text, lp in best]


def piece_id(tokenizer: Any, piece: str) -> int | None:
    """The token id whose text is ``piece``, or None when no single token decodes to it.

    The completions API returns the chosen token as text; to append it to a prompt of ids we
    need its id back. Encoding the text usually gives exactly one id; when it does not
    (a piece that BPE would merge differently on its own), search the vocabulary.
    """
    ids = tokenizer.encode(piece, add_special_tokens=False)
    if len(ids) == 1 and tokenizer.decode(ids) == piece:
        return ids[0]
    matches = [i for i in range(len(tokenizer)) if tokenizer.decode([i]) == piece]
    return matches[0] if len(matches) == 1 else None


def plot_top_probabilities(top: Sequence[tuple[str, float]], prompt: str):
    """Horizontal bars: the server's most likely next tokens after ``prompt``, best on top."""
    from workshop.plots import figure

    short = prompt if len(prompt) <= 40 else "…" + prompt[-39:]
    fig, ax = figure(f"Next token after \"{short}\"", "probability (from the server's logprobs)",
                     "candidate next token", size=(7.0, 3.2))
    labels = [shown(t) for t, _ in top][::-1]
    probs = [p for _, p in top][::-1]
    bars = ax.barh(labels, probs, color="tab:blue")
    bars[-1].set_color("tab:orange")
    bars[-1].set_label("most likely: what greedy decoding picks")
    for bar, p in zip(bars, probs):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {p:.1%}",
                va="center", fontsize=9)
    ax.set_xlim(0, min(1.0, max(probs) * 1.25 + 0.02))
    ax.legend(loc="lower right", fontsize=8)
    return fig


__all__ = ["load_tokenizer", "shown", "token_rows", "top_probabilities", "piece_id",
           "plot_top_probabilities"]
