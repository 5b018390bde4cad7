"""The engine as a whole, on the bundled model: what it accepts, how one failing request is
contained, and what it reports about its memory."""

from __future__ import annotations

import pytest
import torch

from reference_server.models import ModelError, resolve_model


@pytest.fixture(scope="module")
def path() -> str:
    torch.set_num_threads(1)
    try:
        return resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")


@pytest.fixture(scope="module")
def engine(path):
    from mini_engine import LLMEngine
    return LLMEngine(path, kv_cache_gib=0.02, prefix_cache="hash", num_threads=1)


def run(engine, requests):
    """Step until every request finished; return {request id: (tokens, last output)}."""
    got = {rid: ([], None) for rid, _, _ in requests}
    for rid, prompt, params in requests:
        engine.add_request(prompt, params, rid)
    while engine.has_unfinished():
        for out in engine.step():
            got[out.request_id] = (got[out.request_id][0] + out.new_token_ids, out)
    return got


@pytest.mark.parametrize("prompt", [[], [1, -1, 2], [1, 49152], [10 ** 9]])
def test_add_request_rejects_empty_prompts_and_ids_outside_the_vocabulary(engine, prompt):
    from mini_engine import SamplingParams
    assert engine.runner.cfg.vocab_size == 49152
    with pytest.raises(ValueError):
        engine.add_request(prompt, SamplingParams(max_tokens=2))
    assert not engine.has_unfinished() and not engine.requests


def test_one_failing_request_does_not_harm_the_others(engine):
    from mini_engine import SamplingParams
    prompt = [1, 504, 3458, 28, 253, 1978, 42]
    ok = SamplingParams(max_tokens=6, ignore_eos=True)
    alone = run(engine, [("alone", prompt, ok)])["alone"][0]
    # NaN temperature: sampling has no distribution to draw from and raises
    got = run(engine, [("a", prompt, ok),
                       ("bad", prompt[:4], SamplingParams(max_tokens=6, temperature=float("nan"))),
                       ("b", prompt, ok)])
    tokens, out = got["bad"]
    assert out.finish_reason == "error" and out.error and "ValueError" in out.error
    assert tokens == []
    assert got["a"][0] == alone and got["b"][0] == alone
    assert got["a"][1].finish_reason == "length" and got["a"][1].error is None
    st = engine.stats()
    assert st["num_running"] == 0 and st["free_blocks"] + st["cached_blocks"] == st["num_blocks"]
    assert not engine.requests
    assert run(engine, [("after", prompt, ok)])["after"][0] == alone   # still serving


@pytest.mark.parametrize("temperature", [1e-40, 1e-6, 0.0])
def test_tiny_temperature_is_greedy(engine, temperature):
    from mini_engine import SamplingParams
    prompt = [1, 504, 3458, 28]
    greedy = run(engine, [("g", prompt, SamplingParams(max_tokens=4, ignore_eos=True))])["g"][0]
    got = run(engine, [("t", prompt, SamplingParams(max_tokens=4, ignore_eos=True,
                                                    temperature=temperature))])["t"]
    assert got[0] == greedy and got[1].error is None


def test_kv_bytes_per_token_is_measured_on_the_pool(path, engine):
    """The reported figure is pool bytes / slots, checked against the tensors themselves
    and against the textbook formula (an independent quantity)."""
    from mini_engine import LLMEngine
    kv = engine.runner.kv_cache
    slots = engine.block_manager.num_blocks * engine.config.block_size
    pool = sum(t.numel() * t.element_size() for layer in kv.layers for t in layer)
    c = engine.runner.cfg
    assert engine.stats()["kv_bytes_per_token"] == pool // slots
    assert pool // slots == c.num_layers * 2 * c.num_kv_heads * c.head_dim * 4   # fp32 K and V
    assert pool <= 0.02 * (1 << 30)
    mqa = LLMEngine(path, kv_cache_gib=0.01, attention="mqa", num_threads=1)
    assert mqa.runner.kv_bytes_per_token() * c.num_kv_heads == engine.runner.kv_bytes_per_token()


def test_prepacked_weights_change_speed_not_tokens(path):
    """bf16 with the linear weights packed for oneDNN once gives the very tokens of bf16
    multiplied from the plain weights (the same kernel runs; only its per-call repacking
    is gone), for a batch that mixes prefills and decodes."""
    from mini_engine import LLMEngine, SamplingParams
    from mini_engine.linear import PackedLinear, can_prepack
    if not can_prepack(torch.bfloat16, "cpu"):
        pytest.skip("this CPU's oneDNN has no bf16 matmul: the engine does not pack here")
    prompts = [[1, 504, 3458, 28, 2680, 314], [1, 2680, 1912], list(range(1, 60))]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    outs = {}
    for prepack in (False, True):
        eng = LLMEngine(path, kv_cache_gib=0.02, dtype="bfloat16", prepack=prepack,
                        num_threads=1)
        layers = [eng.runner.model.lm_head] + [getattr(layer, n) for layer in
                                               eng.runner.model.layers
                                               for n in ("qkv", "o", "gate_up", "down")]
        assert all(isinstance(m, PackedLinear) == prepack for m in layers)
        outs[prepack] = eng.generate(prompts, params)
    assert outs[True] == outs[False]


# Where two bf16 forms of the same attention part ways, the token one took must be nearly as
# likely as the other's under the other's logits: a near-tie that rounding flipped. Seen on a
# 2-core AVX2 CPU (bf16 emulated): texts parted at gaps of 0 to 0.13 nats.
NEAR_TIE_NATS = 1.0


def assert_parted_only_on_near_ties(outs: list[list[int]], refs: list) -> None:
    """``outs``: token ids of each sequence; ``refs``: the reference run's sequences (their
    ``logprobs`` asked for). Each text follows its reference until they part; where it parts,
    its token was within ``NEAR_TIE_NATS`` of the reference's under the reference's logits
    (after that the texts go their own ways, and are not compared)."""
    for out, ref in zip(outs, refs):
        i = next((j for j, (a, b) in enumerate(zip(out, ref.output_token_ids)) if a != b), None)
        if i is None:
            continue
        top = dict(ref.logprobs[i].top)
        assert out[i] in top, (i, out, ref.output_token_ids, top)
        assert top[ref.output_token_ids[i]] - top[out[i]] <= NEAR_TIE_NATS, (i, top)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_decode_attention_written_out_gives_the_sdpa_tokens(path, dtype, monkeypatch):
    """The cached-key attention as two matmuls and a float32 softmax (``eager``) gives the
    tokens of SDPA's kernel: in float32 all of them; in bf16, where either form rounds its
    own way, the same tokens until a near-tie flips (``assert_parted_only_on_near_ties``)."""
    from mini_engine import LLMEngine, SamplingParams, model
    calls = []
    eager = model.eager_attention
    monkeypatch.setattr(model, "eager_attention", lambda *a: calls.append(1) or eager(*a))
    prompts = [[1, 504, 3458, 28, 2680, 314], [1, 2680, 1912], list(range(1, 60)),
               [1, 9906, 11, 1312, 1101]]
    params = SamplingParams(max_tokens=12, ignore_eos=True, logprobs=5)
    seqs = {}
    for attn in ("sdpa", "eager"):
        eng = LLMEngine(path, kv_cache_gib=0.02, dtype=dtype, decode_attention=attn,
                        num_threads=1)
        seqs[attn] = [eng.add_request(p, params) for p in prompts]
        while eng.has_unfinished():
            eng.step()
        assert bool(calls) == (attn == "eager")          # the path asked for is the one taken
    outs = {attn: [s.output_token_ids for s in ss] for attn, ss in seqs.items()}
    if dtype == "float32":
        assert outs["eager"] == outs["sdpa"]
    else:
        assert_parted_only_on_near_ties(outs["eager"], seqs["sdpa"])


def test_auto_attention_asks_for_this_cpus_amx(path, monkeypatch):
    """``auto`` picks its attention form by whether the CPU has AMX tiles (SDPA's kernel runs
    on them): the model probes once, and every group's choice is asked with that answer."""
    from mini_engine import LLMEngine, SamplingParams, model
    use_eager = model.use_eager
    for amx in (False, True):
        monkeypatch.setattr(model, "cpu_has_amx", lambda: amx)
        asked = []
        monkeypatch.setattr(model, "use_eager",
                            lambda *a: asked.append(a[-1]) or use_eager(*a))
        eng = LLMEngine(path, kv_cache_gib=0.02, dtype="bfloat16", decode_attention="auto",
                        num_threads=1)
        for p in ([1, 504, 3458], [1, 2680, 1912, 28]):
            eng.add_request(p, SamplingParams(max_tokens=3, ignore_eos=True))
        while eng.has_unfinished():
            eng.step()
        assert asked and set(asked) == {amx}


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cascade_attention_gives_the_tokens_of_a_gather_per_sequence(path, dtype, attn,
                                                                     monkeypatch):
    """Sequences that share cached prefix blocks read them once (``cascade_attention``,
    written out or as two SDPA calls merged) and get the tokens they get when each gathers
    its own copy: all of them in float32; in bf16 (where the two forms round their own way)
    the same until a near-tie flips."""
    from mini_engine import LLMEngine, SamplingParams, model
    monkeypatch.setattr(model, "CASCADE_MIN_SAVED_KEYS", 16)   # short prompts take the path
    calls = []
    cascade = model.cascade_attention
    monkeypatch.setattr(model, "cascade_attention", lambda *a: calls.append(1) or cascade(*a))
    prefix = list(range(1, 41))                             # 2 whole blocks of 16, shared
    params = SamplingParams(max_tokens=10, ignore_eos=True, logprobs=5)
    outs, runs = {}, {}
    for on in (False, True):
        eng = LLMEngine(path, kv_cache_gib=0.02, dtype=dtype, decode_attention=attn,
                        cascade_attention=on, prefix_cache="radix", num_threads=1)
        first = eng.add_request(prefix + [504], params)
        eng.step()                                          # its blocks enter the cache
        seqs = [first] + [eng.add_request(prefix + tail, params)
                          for tail in ([2680, 1912], [9906, 11, 1312], [314])]
        while eng.has_unfinished():
            eng.step()
        assert all(s.num_cached_tokens == 32 for s in seqs[1:])
        outs[on], runs[on] = [s.output_token_ids for s in seqs], seqs
        assert bool(calls) == on
    if dtype == "float32":
        assert outs[True] == outs[False]
    else:
        assert_parted_only_on_near_ties(outs[True], runs[False])


def test_reading_the_pool_slot_by_slot_gives_the_same_tokens(path):
    """``kv_read="slot"`` gathers each context token by token where the default reads whole
    blocks: the same values, so the same tokens, for a batch that mixes a chunked prefill
    (over cached keys) with decodes of different lengths."""
    from mini_engine import LLMEngine, SamplingParams
    prompts = [list(range(1, 60)), [504, 3458, 28], list(range(200, 237))]
    outs = {}
    for read in ("block", "slot"):
        eng = LLMEngine(path, kv_cache_gib=0.02, kv_read=read, max_num_batched_tokens=40,
                        num_threads=1)
        assert eng.runner.kv_cache.by_slot == (read == "slot")
        outs[read] = eng.generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    assert outs["block"] == outs["slot"]


def test_a_lone_decode_runs_on_solo_threads(path):
    """``solo_threads`` applies to the steps that decode one sequence alone; a step with
    more sequences (or a longer prefill) runs on ``num_threads``."""
    from mini_engine import LLMEngine, SamplingParams
    before = torch.get_num_threads()
    try:
        eng = LLMEngine(path, kv_cache_gib=0.02, num_threads=2, solo_threads=1)
        eng.add_request([1, 504, 3458], SamplingParams(max_tokens=2, ignore_eos=True), "short")
        eng.add_request(list(range(1, 40)), SamplingParams(max_tokens=6, ignore_eos=True), "long")
        seen = []
        while eng.has_unfinished():
            eng.step()
            scheduled = eng.history[-1].scheduled
            seen.append((len(scheduled), sum(n for _, n, _ in scheduled),
                         torch.get_num_threads()))
        assert {t for n, tokens, t in seen if n == 1 and tokens == 1} == {1}
        assert {t for n, tokens, t in seen if n > 1 or tokens > 8} == {2}
    finally:
        torch.set_num_threads(before)
