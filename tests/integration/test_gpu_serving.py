"""The server on a GPU: the teaching engine and the Hugging Face baseline with ``--device cuda``.

What Colab and Molab learners run, and CI cannot: there is no GPU there, so this module is
skipped, and it runs where one is (``pytest tests/integration/test_gpu_serving.py``). vLLM's
CUDA build is not in it: it is vLLM's own code, and its wheel is not installed beside the CPU
one.

The model is a small Llama with random weights built here (no download) around the bundled
model's tokenizer and chat template, so prompts, templates and detokenisation are the real
ones. Each engine is started as a real server over real HTTP; the test checks that its memory
is on the GPU (the device's free memory drops by the KV pool / weights when it starts), that
plain, streamed and chat requests complete with the requested token counts, and that bad
input still gets a 400 with an OpenAI-style body.
"""

from __future__ import annotations

import json
import shutil

import httpx
import pytest
import torch
from conftest import DONE, sse_events

from reference_server import launch as launcher
from reference_server.models import bundled_model_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "generation_config.json")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM
    src = bundled_model_dir()
    if not (src / "tokenizer.json").exists():
        pytest.skip(f"no bundled tokenizer in {src}: run `workshop model prepare`")
    bundled = json.loads((src / "config.json").read_text())
    dst = tmp_path_factory.mktemp("tiny-on-gpu")
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=bundled["vocab_size"], hidden_size=128, intermediate_size=256,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=bundled.get("bos_token_id"),
                      eos_token_id=bundled.get("eos_token_id"))
    LlamaForCausalLM(cfg).save_pretrained(dst)
    return str(dst)


@pytest.mark.parametrize("engine", ["mini", "hf"])
def test_engine_serves_from_the_gpu(tiny_model, engine, tmp_path):
    free_before = torch.cuda.mem_get_info()[0]
    server = launcher.launch(["--engine", engine, "--model", tiny_model, "--device", "cuda",
                              "--kv-cache-gib", "0.5"], log_path=tmp_path / f"{engine}.log")
    try:
        server.wait_ready(timeout=300)
        used = free_before - torch.cuda.mem_get_info()[0]
        print(f"{engine}: the server took {used / 2**20:.0f} MiB of GPU memory")
        assert used > 100 * 2**20, "the engine's memory is not on the GPU"
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            info = client.get("/server_info").json()
            assert info["device"] == "cuda" and info["engine"] == engine
            model = client.get("/v1/models").json()["data"][0]["id"]

            r = client.post("/v1/completions", json={
                "model": model, "prompt": "The capital of France is", "max_tokens": 8,
                "ignore_eos": True, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["usage"]["completion_tokens"] == 8

            with client.stream("POST", "/v1/chat/completions", json={
                    "model": model, "messages": [{"role": "user", "content": "Hello"}],
                    "max_tokens": 6, "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}) as s:
                assert s.status_code == 200
                events = sse_events(s.read())
            assert events[-1] == DONE and events[-2]["usage"]["completion_tokens"] == 6

            r = client.post("/v1/completions", json={"model": model, "prompt": "hi",
                                                      "max_tokens": -1})
            assert r.status_code == 400 and r.json()["error"]["type"], r.text
    except Exception:
        print(server.log_tail())
        raise
    finally:
        server.stop()
