"""``workshop.session.start``: a notebook's own teaching-engine server with the knobs it asks
for."""

from __future__ import annotations

import httpx
import pytest
import torch

from mini_engine.linear import packs
from workshop import session

pytestmark = pytest.mark.engine


def test_start_serves_the_knobs_asked_for_and_stops():
    # 0.1 GiB: room for one whole-context contiguous request also in float32 (a CPU without bf16)
    with session.start("mini", ["--kv-cache-gib", "0.1", "--", "--kv-layout", "contiguous",
                                "--block-size", "32"], verbose=False) as s:
        assert s.api_key and s.process is not None
        info = s.get_json("/server_info")
        assert info["engine"] == "mini" and info["block_size"] == 32
        assert info["extra"]["kv_layout"] == "contiguous"
        # a lone decode leaves a core to the server, unless the weights are packed for oneDNN
        # (bf16 where this CPU's oneDNN computes it), whose kernel gains from every core
        packed = packs(getattr(torch, info["dtype"]), "cpu", prepack=True)
        assert info["extra"]["solo_threads"] == (torch.get_num_threads() if packed
                                                 else max(1, torch.get_num_threads() - 1))
        assert httpx.get(s.base_url + "/server_info").status_code == 401   # its own key
        r = s.openai().completions.create(model=s.model, prompt="Hello", max_tokens=2)
        assert r.usage.completion_tokens == 2
    assert s.process is None or s.process.poll() is not None
    with pytest.raises(httpx.HTTPError):
        httpx.get(s.base_url + "/health", timeout=2)

