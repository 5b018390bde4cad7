"""The teaching engine on every device this machine has: the CPU always, CUDA where a GPU is.

``test_mini_exactness.py`` pins the engine to Hugging Face token for token with the bundled
model, on the CPU. Learners in Colab or Molab run the same engine with ``device="cuda"``: the
same code with its tensors elsewhere, so what can break there is a tensor made on the wrong
device, a CPU-only kernel, or an index that the CPU forgives. CI has no GPU, so these tests
are written to run unchanged on any device: the CUDA cases are skipped where none is and run
where one is lent (``pytest tests/unit/test_mini_devices.py``).

The model is a small Llama with random weights (no download), made once per module. Each
engine run is checked by teacher forcing: HF's fp32 logits for the prompt plus the engine's
own output, on the same device, in one forward; every token the engine chose must be HF's
argmax or within ``TOL`` of it. Judging each token against its own context keeps the check
strict where a greedy comparison of whole texts is brittle: one near-tie flipped by another
summation order (another device, batch shape or dtype) would otherwise fail every later
token. The weights are drawn wider than Hugging Face's default (std 0.2, not 0.02) so that
logits spread like a trained model's instead of sitting in a near-tie everywhere.
"""

from __future__ import annotations

import functools
import os
import random

import pytest
import torch

from workshop.session import quick

NEW_TOKENS = 12 if quick() else 32
VOCAB = 512
THREADS = min(2, os.cpu_count() or 1)

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="no CUDA device here")),
]
# Largest logit gap (max logit - logit of the engine's token) allowed, logits being of order
# 1-10 here. fp32: summation order alone (measured gaps are ~1e-5). bf16: 8 bits of mantissa
# through 4 layers; the value is a bound on the measured worst gap with room to spare.
TOL = {"float32": 2e-3, "bfloat16": 2.0}
BF16_ARGMAX_SHARE = 0.7


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      initializer_range=0.2, rms_norm_eps=1e-5, eos_token_id=None)
    path = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    ids = lambda n: [rng.randrange(VOCAB) for _ in range(n)]  # noqa: E731
    phrase = ids(12)
    return [ids(3), ids(17), ids(40), ids(100), ids(300),
            phrase * 5,          # repeats: the n-gram proposer finds drafts
            ids(700)]            # longer than the default token budget: chunked prefill


def _hf(path: str, device: str, state_dict=None, num_kv_heads=None):
    from transformers import AutoConfig, LlamaForCausalLM
    config = AutoConfig.from_pretrained(path)
    if num_kv_heads:
        config.num_key_value_heads = num_kv_heads
    if state_dict is None:
        return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    model = LlamaForCausalLM(config).float().eval()
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    assert not unexpected and all("lm_head" in m for m in missing)
    model.tie_weights()
    return model.to(device)


@pytest.fixture(scope="module")
def reference(model_path):
    """``reference(device)``: HF with the plain weights on ``device``, built on first use."""
    return functools.cache(lambda device: _hf(model_path, device))


def logit_gaps(model, prompts, outputs) -> torch.Tensor:
    """Every output token's (max logit - logit of the chosen token): 0 where the engine chose
    HF's argmax. One forward of prompt + output per prompt (teacher forcing)."""
    device = next(model.parameters()).device
    gaps = []
    with torch.inference_mode():
        for p, out in zip(prompts, outputs):
            assert len(out) > 0
            logits = model(torch.tensor([p + out], device=device)).logits[0].float()
            rows = logits[len(p) - 1: len(p) - 1 + len(out)]
            chosen = rows.gather(1, torch.tensor(out, device=device)[:, None])[:, 0]
            gaps.append((rows.max(1).values - chosen).cpu())
    return torch.cat(gaps)


def check(gaps: torch.Tensor, dtype: str, what: str, tol: float | None = None) -> None:
    """fp32: every token within ``tol`` of HF's argmax. bf16: its rounding flips near-ties,
    so most tokens (``BF16_ARGMAX_SHARE``) must be HF's argmax and none far from it."""
    exact = float((gaps <= TOL["float32"]).float().mean())
    print(f"{what}: {exact:.0%} of {len(gaps)} tokens are HF's argmax, worst gap "
          f"{float(gaps.max()):.1e}")
    if dtype == "float32":
        assert float(gaps.max()) <= (tol or TOL["float32"]), gaps
    else:
        assert exact >= BF16_ARGMAX_SHARE and float(gaps.max()) <= TOL["bfloat16"], gaps


def run(path, device, prompts, twice=False, **cfg):
    from mini_engine import LLMEngine, SamplingParams
    cfg.setdefault("kv_cache_gib", 0.05)
    eng = LLMEngine(path, device=device, num_threads=THREADS, **cfg)
    assert {t.device.type for layer in eng.runner.kv_cache.layers for t in layer} == {device}
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    out = eng.generate(prompts, params)
    if twice:       # the second pass is served from the prefix cache
        assert eng.generate(prompts, params) == out
    st = eng.stats()
    assert st["free_blocks"] + st["cached_blocks"] == st["num_blocks"]      # nothing leaked
    return eng, out


CONFIGS = {
    "default": {},
    "bf16": {"dtype": "bfloat16"},
    "bf16-eager": {"dtype": "bfloat16", "decode_attention": "eager"},
    "slot-read": {"kv_read": "slot"},
    "contiguous": {"kv_layout": "contiguous", "max_model_len": 1024, "num_blocks": 4 * 64},
    "static": {"scheduler": "static", "max_num_seqs": 3},
    "no-chunked-prefill": {"chunked_prefill": False, "max_num_batched_tokens": 1024},
    "tiny-budget": {"max_num_batched_tokens": 24},
    "preemption": {"num_blocks": 60, "max_num_batched_tokens": 64},
    "prefix-hash": {"prefix_cache": "hash"},
    "prefix-radix": {"prefix_cache": "radix"},
    "block-size-1": {"block_size": 1, "prefix_cache": "radix"},
    "spec-ngram": {"spec": "ngram"},
    "spec-self": {"spec": "self", "draft_layers": 2},
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CONFIGS))
def test_engine_tokens_are_hf_argmax(model_path, prompts, reference, device, name):
    cfg = CONFIGS[name]
    eng, out = run(model_path, device, prompts, twice="prefix_cache" in cfg, **cfg)
    st = eng.stats()
    if name == "preemption":
        assert st["num_preemptions"] > 0
    if "prefix_cache" in cfg:
        assert st["prefix_cache_hits"] > 0
    if "spec" in cfg:
        assert 0 < st["spec"]["num_accepted_tokens"] <= st["spec"]["num_draft_tokens"]
    gaps = logit_gaps(reference(device), prompts, out)
    check(gaps, cfg.get("dtype", "float32"), f"{device} {name}")


# Model-changing variants: the reference is HF holding the engine's effective weights.
VARIANTS = {"int8": {"quant": "int8"}, "int4": {"quant": "int4"}, "mqa": {"attention": "mqa"},
            "mla": {"attention": "mla", "mla_rank": 48}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_tokens_are_argmax_of_hf_with_its_weights(model_path, prompts, device, name):
    eng, out = run(model_path, device, prompts, **VARIANTS[name])
    ref = _hf(model_path, device, eng.runner.hf_state_dict(),
              num_kv_heads=1 if name == "mqa" else None)
    # MLA computes (x @ down^T) @ up^T where HF computes x @ (up @ down)^T: equal in exact
    # arithmetic, not in fp32's rounding
    check(logit_gaps(ref, prompts, out), "float32", f"{device} {name}",
          tol=10 * TOL["float32"] if name == "mla" else None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_cascade_attention_on_device(model_path, reference, device, dtype, attn, monkeypatch):
    """Sequences sharing cached blocks read them once for the batch (cascade attention, in
    either attention form), and their tokens are still HF's."""
    from mini_engine import LLMEngine, SamplingParams, model
    calls = []
    cascade = model.cascade_attention
    monkeypatch.setattr(model, "cascade_attention", lambda *a: calls.append(1) or cascade(*a))
    rng = random.Random(1)
    shared = [rng.randrange(VOCAB) for _ in range(720)]      # 45 blocks of 16
    tails = [[rng.randrange(VOCAB) for _ in range(n)] for n in (1, 5, 9, 13, 2, 7, 11, 3)]
    eng = LLMEngine(model_path, device=device, dtype=dtype, decode_attention=attn,
                    prefix_cache="radix", kv_cache_gib=0.05, num_threads=THREADS)
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    first = eng.generate([shared + tails[0]], params)     # the shared blocks enter the cache
    rest = eng.generate([shared + t for t in tails[1:]], params)
    assert calls, "cascade attention never ran"
    prompts = [shared + t for t in tails]
    gaps = logit_gaps(reference(device), prompts, first + rest)
    check(gaps, dtype, f"{device} cascade {attn} {dtype}")
