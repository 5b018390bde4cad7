"""Small pieces of the teaching engine: speculative acceptance, n-gram lookup, sampler,
quantized and prepacked linears, the written-out attention, the KV pool's block reads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from mini_engine.attention_metadata import Chunk, additive_mask, prepare
from mini_engine.kv_cache import KVCache, KVLayout
from mini_engine.linear import DenseLinear, PackedLinear, can_prepack, make_linear
from mini_engine.model import (
    cascade_attention,
    cpu_has_amx,
    eager_attention,
    merge_attention,
    sdpa_with_lse,
    use_cascade,
    use_eager,
)
from mini_engine.quant import Int4Linear, Int8Linear
from mini_engine.sampler import logprob_of, sample_row
from mini_engine.sequence import SAMPLING_EPS, SamplingParams
from mini_engine.spec_decode import NgramProposer, SpecStats, accept_greedy


def test_accept_greedy():
    assert accept_greedy([5, 6, 7], [5, 6, 7, 8]) == [5, 6, 7, 8]   # all accepted + bonus
    assert accept_greedy([5, 6, 7], [5, 9, 7, 8]) == [5, 9]         # correction at mismatch
    assert accept_greedy([5], [4, 1]) == [4]                         # nothing accepted
    assert accept_greedy([], [3]) == [3]


def test_spec_stats_accounting():
    s = SpecStats()
    s.record(4, 2)
    s.record(3, 3)
    s.record(0, 0)
    assert (s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens) == (2, 7, 5)
    assert s.accepted_per_position == [2, 2, 1, 0]
    assert abs(s.acceptance_rate - 5 / 7) < 1e-9


def test_ngram_prompt_lookup():
    p = NgramProposer(max_n=3)
    assert p.propose_one([1, 2, 3, 4, 9, 1, 2, 3], 2) == [4, 9]
    assert p.propose_one([1, 2, 3, 7, 2, 3, 8, 2, 3], 3) == [8, 2, 3]   # latest occurrence
    assert p.propose_one([1, 2, 3], 3) == []
    assert p.propose_one([5], 3) == []


def test_sampler_greedy_seeded_top_p():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    assert sample_row(logits, SamplingParams(), None) == 1
    sp = SamplingParams(temperature=1.0, seed=7)
    a = [sample_row(logits, sp, torch.Generator().manual_seed(7)) for _ in range(3)]
    b = [sample_row(logits, sp, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert a == b
    tiny_p = SamplingParams(temperature=1.0, top_p=0.01)
    assert {sample_row(logits, tiny_p, None) for _ in range(20)} == {1}
    lp = logprob_of(logits, 3, 2)
    assert lp.token_id == 3 and [t for t, _ in lp.top] == [1, 3]
    assert abs(lp.logprob - float(torch.log_softmax(logits, -1)[3])) < 1e-6


def test_int8_and_int4_reconstruct_weights():
    torch.manual_seed(0)
    w = torch.randn(64, 128) * 0.05
    x = torch.randn(3, 128)
    q8, q4 = Int8Linear(w), Int4Linear(w, group_size=32)
    err8 = (q8.dequantize() - w).abs().max() / w.abs().max()
    err4 = (q4.dequantize() - w).abs().max() / w.abs().max()
    assert err8 < 1 / 127 and err4 < 0.1 and err8 < err4
    assert q8.qweight.dtype == torch.int8 and q4.packed.dtype == torch.uint8
    assert q4.packed.shape == (64, 64)                     # two 4-bit values per byte
    assert q8.nbytes() < w.numel() * 4 / 3.5 and q4.nbytes() < w.numel() * 4 / 5
    ref = x @ w.T
    assert torch.allclose(q8(x), ref, atol=0.02) and torch.allclose(q4(x), ref, atol=0.2)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
def test_packed_linear_keeps_the_layer_contract():
    # fp32 here so that it runs on any oneDNN CPU; the engine packs only bf16/fp16 (below)
    torch.manual_seed(0)
    w, b = torch.randn(96, 64), torch.randn(96)
    dense, packed = DenseLinear(w, b), PackedLinear(w, b)
    assert packed.weight.layout == torch._mkldnn                  # stored in oneDNN's layout
    assert torch.equal(packed.dequantize(), w)                   # and read back unchanged
    assert packed.nbytes() == dense.nbytes() == w.numel() * 4
    for x in (torch.randn(1, 64), torch.randn(7, 64), torch.randn(2, 3, 64)):
        assert packed(x).shape == dense(x).shape
        assert torch.allclose(packed(x), dense(x), atol=1e-4)


def test_make_linear_packs_only_what_can_be_packed():
    w = torch.randn(8, 16)
    assert type(make_linear(w, None, None, prepack=True)) is DenseLinear      # fp32: as HF
    assert type(make_linear(w, None, "int8", prepack=True)) is Int8Linear
    bf16 = make_linear(w.bfloat16(), None, None, prepack=True)
    assert type(bf16) is (PackedLinear if can_prepack(torch.bfloat16, "cpu") else DenseLinear)
    assert type(make_linear(w.bfloat16(), None, None, prepack=False)) is DenseLinear
    assert not can_prepack(torch.float32, "cpu") and not can_prepack(torch.bfloat16, "meta")
    # float32 only when asked (the engine's prepack_fp32), and only where oneDNN is
    fp32 = make_linear(w, None, None, prepack=True, prepack_fp32=True)
    assert type(fp32) is (PackedLinear if torch.backends.mkldnn.is_available() else DenseLinear)
    assert type(make_linear(w, None, None, prepack=False, prepack_fp32=True)) is DenseLinear
    with pytest.raises(ValueError):
        make_linear(w, None, "int3")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_eager_attention_is_sdpa_written_out(dtype, tol):
    # the decode group's shapes: [kv_heads, B, group*Q, head_dim] against B padded contexts
    torch.manual_seed(0)
    kvh, B, rows, L, d = 3, 4, 3, 40, 64
    q, k, v = (torch.randn(kvh, B, n, d, dtype=dtype) for n in (rows, L, L))
    ctx = torch.tensor([40, 17, 1, 33])                               # keys each sequence has
    mask = (torch.arange(L) < ctx[:, None])[None, :, None, :].expand(1, B, rows, L)
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    got = eager_attention(q, k, v, mask)
    assert got.dtype == dtype and got.shape == want.shape
    assert (got.float() - want).abs().max() < tol
    # the padding really is masked: garbage past a sequence's context changes nothing
    k2, v2 = k.clone(), v.clone()
    k2[:, 1, 17:], v2[:, 1, 17:] = 1e3, -1e3
    assert torch.equal(eager_attention(q, k2, v2, mask), got)


def test_auto_decode_attention_is_eager_only_for_big_reduced_precision_batches():
    bf16, fp32 = torch.bfloat16, torch.float32
    for amx in (False, True):
        assert use_eager("auto", bf16, 32, 1400, amx)
        assert use_eager("auto", torch.float16, 32, 600, amx)
        assert not use_eager("auto", bf16, 8, 150, amx)   # too few keys: SDPA is the faster
        assert not use_eager("auto", bf16, 1, 30000, amx)  # one sequence: SDPA
        assert not use_eager("auto", fp32, 32, 1000, amx)  # float32: SDPA, as Hugging Face
        assert use_eager("eager", fp32, 1, 10, amx)
        assert not use_eager("sdpa", bf16, 32, 1000, amx)
    # SDPA's kernel on AMX tiles stays the faster for more keys
    assert use_eager("auto", bf16, 32, 150, amx=False)
    assert use_eager("auto", bf16, 8, 600, amx=False)
    assert not use_eager("auto", bf16, 32, 150, amx=True)
    assert not use_eager("auto", bf16, 8, 1400, amx=True)   # the agentic workload's decodes
    assert use_eager("auto", bf16, 8, 1400) == (not cpu_has_amx())   # this CPU's, by default


@pytest.mark.parametrize("written_out", [True, False], ids=["written-out", "sdpa"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_cascade_attention_is_attention_over_the_whole_context(dtype, tol, written_out):
    """A shared prefix read once (one copy of its keys) gives attention over prefix + own
    keys, as if every sequence had its own copy of the prefix: written out with one softmax,
    or as two SDPA calls merged by their log-sum-exp; the mask boolean or additive."""
    torch.manual_seed(0)
    kvh, B, rows, P, L, d = 3, 4, 3, 32, 20, 64
    q = torch.randn(kvh, B, rows, d, dtype=dtype)
    ks, vs = (torch.randn(kvh, 1, P, d, dtype=dtype) for _ in range(2))
    k, v = (torch.randn(kvh, B, L, d, dtype=dtype) for _ in range(2))
    own = torch.tensor([20, 7, 1, 13])                                # own keys per sequence
    mask = (torch.arange(L) < own[:, None])[None, :, None, :].expand(1, B, rows, L)
    whole = torch.cat((ks.expand(kvh, B, P, d), k), 2), torch.cat((vs.expand(kvh, B, P, d), v), 2)
    full_mask = torch.cat((torch.ones(1, B, rows, P, dtype=torch.bool), mask), -1)
    want = F.scaled_dot_product_attention(q.float(), whole[0].float(), whole[1].float(),
                                          attn_mask=full_mask)
    got = cascade_attention(q, ks, vs, k, v, mask, written_out)
    assert got.dtype == dtype and got.shape == want.shape
    assert (got.float() - want).abs().max() < tol
    # the engine's additive mask, a slice of the whole context's as the model passes it
    additive = additive_mask(full_mask, dtype)[..., P:]
    assert torch.equal(cascade_attention(q, ks, vs, k, v, additive, written_out), got)
    k2, v2 = k.clone(), v.clone()                   # what lies past a sequence's keys is masked
    k2[:, 1, 7:], v2[:, 1, 7:] = 1e3, -1e3
    assert torch.equal(cascade_attention(q, ks, vs, k2, v2, mask, written_out), got)


def test_sdpa_with_lse_returns_the_log_of_each_rows_softmax_denominator():
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 64) for n in (5, 40, 40))
    mask = torch.arange(40)[None, None, None, :] < torch.tensor([40, 9])[None, :, None, None]
    out, lse = sdpa_with_lse(q, k, v, mask)
    scores = (q @ k.transpose(-1, -2) / 8).masked_fill(~mask, float("-inf"))
    assert lse.shape == (3, 2, 5, 1) and lse.dtype == torch.float32
    assert (lse - scores.logsumexp(-1, keepdim=True)).abs().max() < 1e-5
    assert (out - F.scaled_dot_product_attention(q, k, v, attn_mask=mask)).abs().max() < 1e-6


def test_merging_two_halves_gives_attention_over_both():
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 64) for n in (4, 50, 50))
    halves = [sdpa_with_lse(q, k[:, :, s], v[:, :, s]) for s in (slice(0, 20), slice(20, 50))]
    got = merge_attention(*halves[0], *halves[1])
    assert (got - F.scaled_dot_product_attention(q, k, v)).abs().max() < 1e-6


def test_cascade_only_where_it_saves_enough_keys():
    assert use_cascade(True, 8, 1024) and use_cascade(True, 5, 1024)   # 4 x 1,024 saved
    assert not use_cascade(True, 4, 1024)             # 3 x 1,024: the extra matmuls cost more
    assert not use_cascade(True, 8, 0) and not use_cascade(False, 8, 1024)


def test_shared_len_is_the_common_whole_blocks_before_every_query():
    bs = 4
    shared = [7, 3, 9]
    chunks = [Chunk(shared + [1, 2], 17, [5], 1),     # decode at position 17
              Chunk(shared + [4], 14, [5], 1),
              Chunk(shared[:2] + [8, 6], 13, [5], 1)]
    _, meta = prepare(chunks, bs, torch.device("cpu"))
    (g,) = meta.groups
    assert g.shared_len == 2 * bs                     # the third table leaves after 2 blocks
    assert torch.equal(g.shared_blocks, torch.tensor([7, 3]))
    assert torch.equal(g.own_blocks.view(3, -1), g.blocks[:, 2:])
    assert g.blocks.shape == (3, 5)                   # the longest context, 18 keys: 5 blocks
    # a query inside the shared blocks caps it: all shared keys must precede every query
    _, meta = prepare([Chunk(shared, 9, [5], 1), Chunk(shared + [4], 14, [5], 1)], bs,
                      torch.device("cpu"))
    assert meta.groups[0].shared_len == 2 * bs
    _, meta = prepare([Chunk(shared, 9, [5], 1)], bs, torch.device("cpu"))   # one sequence
    assert meta.groups[0].shared_len == 0


@pytest.mark.parametrize("shapes", [((3, None, 8), (3, None, 8)),     # K and V: [heads, slot, d]
                                    ((None, 5),)])                     # one MLA latent
@pytest.mark.parametrize("read", ["block", "slot"])
def test_read_blocks_is_read_of_those_blocks_slots(shapes, read):
    """Reading whole blocks gives what reading their slots one by one gives, in the block
    table's order, whatever the blocks' places in the pool (and so does the pool that reads
    slot by slot, kept for comparison)."""
    bs = 4
    kv = KVCache(KVLayout(shapes), num_layers=2, num_blocks=10, block_size=bs,
                 dtype=torch.float32, read=read)
    for layer in kv.layers:
        for t in layer:
            t.copy_(torch.randn_like(t))
    blocks = torch.tensor([7, 2, 9, 0, 2])
    slots = (blocks[:, None] * bs + torch.arange(bs)).reshape(-1)
    for layer in range(2):
        got, want = kv.read_blocks(layer, blocks), kv.read(layer, slots)
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_sampler_tiny_temperature_is_greedy_and_never_nan():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9]) * 100
    for t in (1e-40, 1e-6, 0.0, -1.0):                 # below vLLM's epsilon: greedy
        assert SamplingParams(temperature=t).greedy
        assert sample_row(logits, SamplingParams(temperature=t), None) == 1
    assert not SamplingParams(temperature=SAMPLING_EPS).greedy
    # just above the epsilon the division is huge but the softmax stays finite
    g = torch.Generator().manual_seed(0)
    assert sample_row(logits, SamplingParams(temperature=2e-5), g) == 1
    with pytest.raises(ValueError):                    # no distribution: an error, not a NaN draw
        sample_row(logits, SamplingParams(temperature=float("nan")), g)
    with pytest.raises(ValueError):
        sample_row(torch.tensor([0.0, float("nan")]), SamplingParams(temperature=1.0), g)
