"""Notebook 0's look at one token: logprobs -> probabilities, token text -> id, the chart."""

from __future__ import annotations

import math

from workshop.live import next_token


class _Tokenizer:
    """Three single-character tokens and one two-character token ("ab")."""

    vocab = ["a", "b", " c", "ab"]

    def __len__(self):
        return len(self.vocab)

    def decode(self, ids):
        return "".join(self.vocab[i] for i in ids)

    def encode(self, text, add_special_tokens=False):
        out, i = [], 0
        while i < len(text):
            if text.startswith("ab", i):
                out.append(3)
                i += 2
            elif text.startswith(" c", i):
                out.append(2)
                i += 2
            else:
                out.append(self.vocab.index(text[i]))
                i += 1
        return out


def test_top_probabilities_sorts_cuts_and_exponentiates():
    # vLLM may send k + 1 entries (the sampled token added); the k best must come back.
    top = next_token.top_probabilities({"x": math.log(0.1), "y": math.log(0.6),
                                        "z": math.log(0.05), "w": math.log(0.2)}, k=3)
    assert [t for t, _ in top] == ["y", "w", "x"]
    assert [round(p, 6) for _, p in top] == [0.6, 0.2, 0.1]


def test_piece_id_finds_single_tokens_and_refuses_pieces_of_several():
    tok = _Tokenizer()
    assert next_token.piece_id(tok, " c") == 2
    assert next_token.piece_id(tok, "ab") == 3
    assert next_token.piece_id(tok, "b") == 1
    assert next_token.piece_id(tok, "ba") is None       # two tokens, no single one


def test_piece_id_unknown_text_is_none():
    class _Strict(_Tokenizer):
        def encode(self, text, add_special_tokens=False):
            return [0, 0]                                  # never a single id
    assert next_token.piece_id(_Strict(), "q") is None
    assert next_token.piece_id(_Strict(), "ab") == 3      # found by the vocabulary search


def test_token_rows_and_shown_make_spaces_visible():
    rows = next_token.token_rows(_Tokenizer(), [3, 2])
    assert rows == [{"position": 0, "token id": 3, "text": "ab"},
                    {"position": 1, "token id": 2, "text": "␣c"}]
    assert next_token.shown("a\nb\t") == "a\\nb\\t"
    assert next_token.shown("") == "(empty)"


def test_plot_top_probabilities_draws_one_bar_per_candidate():
    fig = next_token.plot_top_probabilities([(" Paris", 0.7), (" the", 0.2), (" a", 0.05)],
                                            "The capital of France is")
    ax = fig.axes[0]
    assert len(ax.patches) == 3 and ax.get_title().startswith("Next token")
    widths = sorted(p.get_width() for p in ax.patches)
    assert widths == [0.05, 0.2, 0.7]
