"""Notebook 13's helpers: every loader gives back the very tensors that were saved, the packed
layout's index round-trips, the page-cache drop is checked, the fit recovers known
parameters, and a request moved between two teaching engines goes on unchanged."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch

from workshop.engine_lab import cold_start as cs


def tricky_state_dict() -> dict[str, torch.Tensor]:
    """Every dtype a checkpoint holds, odd sizes (nothing a multiple of 8 bytes), a scalar,
    an empty tensor and bit patterns a float compare would get wrong (NaN, -0.0)."""
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(37, 11, generator=g).to(torch.bfloat16),
        "norm.weight": torch.randn(13, generator=g),
        "half": torch.randn(3, 5, 7, generator=g).to(torch.float16),
        "double": torch.randn(3, generator=g, dtype=torch.float64),
        "ints": torch.randint(-128, 127, (9,), generator=g, dtype=torch.int8),
        "longs": torch.arange(5, dtype=torch.int64) * 2**40,
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "odd bits": torch.tensor([float("nan"), -0.0, float("inf")], dtype=torch.float32),
    }


@pytest.fixture(scope="module")
def bundled_part():
    """Some real tensors of the bundled model (a few MiB: the notebook loads all of them)."""
    from reference_server.models import ModelError, resolve_model
    try:
        folder = resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    return cs.resized(cs.read_safetensors_folder(folder), 6 * cs.MiB)


@pytest.mark.parametrize("which", ["tricky", "bundled"])
@pytest.mark.parametrize("cold", [True, False])
def test_every_format_loads_the_saved_tensors_bit_for_bit(which, cold, bundled_part, tmp_path):
    sd = tricky_state_dict() if which == "tricky" else bundled_part
    paths = cs.write_formats(sd, tmp_path)
    for fmt in cs.FORMATS:
        timed = cs.time_load(fmt, paths[fmt], cold=cold)
        assert timed["checksum"] == cs.checksum(sd), fmt
        assert cs.same_tensors(cs.load(fmt, paths[fmt]), sd), fmt


@pytest.mark.parametrize("chunk_mib,threads", [(1 / 256, 1), (1 / 256, 3), (0.001, 2), (64, 4)])
def test_packed_reads_in_any_chunking(chunk_mib, threads, bundled_part, tmp_path):
    path = cs.write_packed(bundled_part, tmp_path / "m.packed")
    assert cs.same_tensors(cs.load_packed(path, chunk_mib, threads), bundled_part)


def test_packed_index_round_trips_and_is_aligned(tmp_path):
    sd = tricky_state_dict()
    index, data_bytes = cs.packed_index(sd)
    path = cs.write_packed(sd, tmp_path / "m.packed")
    back, start, size = cs.read_packed_index(path)
    assert back == index and size == data_bytes
    assert list(back) == list(sd)                       # the order is the state dict's
    assert start % cs.ALIGN == 0 and path.stat().st_size == start + data_bytes
    spans = sorted((m["offset"], m["offset"] + m["nbytes"]) for m in back.values())
    assert all(lo % cs.ALIGN == 0 for lo, _ in spans)
    assert all(hi <= next_lo for (_, hi), (next_lo, _) in zip(spans, spans[1:]))   # no overlap
    for name, m in back.items():
        assert (m["dtype"], m["shape"], m["nbytes"]) == (
            str(sd[name].dtype).removeprefix("torch."), list(sd[name].shape), sd[name].nbytes)
    # the header is plain JSON after the magic and its length
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[8:16])
    assert raw[:8] == cs.PACKED_MAGIC and json.loads(raw[16:16 + length])["tensors"] == index
    (tmp_path / "other").write_bytes(b"x" * 32)
    with pytest.raises(ValueError):
        cs.read_packed_index(tmp_path / "other")


def test_resized_takes_whole_tensors_and_clones_copies():
    sd = tricky_state_dict()
    total = cs.nbytes(sd)
    small = cs.resized(sd, total // 3)
    assert 0 < cs.nbytes(small) <= total // 3 and set(small) <= set(sd)
    assert cs.resized({"a": torch.zeros(8)}, 1).keys() == {"a"}   # at least one tensor
    big = cs.resized(sd, int(total * 2.5))
    assert total * 2 <= cs.nbytes(big) <= total * 2.5
    copy = big["copy1.embed.weight"]
    assert torch.equal(copy, sd["embed.weight"])
    assert copy.untyped_storage().data_ptr() != sd["embed.weight"].untyped_storage().data_ptr()


def test_checksum_sees_every_byte():
    sd = tricky_state_dict()
    before = cs.checksum(sd)
    changed = {k: v.clone() for k, v in sd.items()}
    changed["norm.weight"].view(torch.uint8)[-1] ^= 1      # the last byte of an odd-sized tensor
    assert cs.checksum(changed) != before


def test_page_cache_drop_is_verified(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(np.random.default_rng(0).bytes(8 * cs.MiB))
    cs.read_seconds(path)
    assert cs.resident_fraction(path) == 1.0
    check = cs.page_cache_check(path)
    if check["cached after drop"] > 0.5:
        pytest.skip(f"{tmp_path} is on a file system that keeps pages despite DONTNEED (tmpfs?)")
    assert check["cached after drop"] <= 0.01
    assert check["cached after first read"] == 1.0


def test_fit_recovers_known_fixed_cost_and_bandwidth():
    rng = np.random.default_rng(1)
    sizes = np.linspace(5e6, 3e8, 8)
    fixed, bandwidth = 0.040, 1.5e9
    seconds = fixed + sizes / bandwidth + rng.normal(0, 0.002, sizes.size)
    fit = cs.fit_load_time(sizes, seconds)
    assert fit.fixed_s == pytest.approx(fixed, abs=0.005)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=0.02)
    assert fit.r2 > 0.99 and fit.points == 8
    assert fit.predict(1e9) == pytest.approx(fixed + 1e9 / bandwidth, rel=0.03)
    exact = cs.fit_load_time([1e8, 2e8], [0.1 + 1e8 / 2e9, 0.1 + 2e8 / 2e9])
    assert (exact.fixed_s, exact.bandwidth) == (pytest.approx(0.1), pytest.approx(2e9))


def test_fit_never_reports_a_negative_fixed_cost():
    fit = cs.fit_load_time([1e8, 2e8, 3e8], [0.05, 0.20, 0.30])    # the line would cross below 0
    assert fit.fixed_s == 0.0
    assert fit.bandwidth == pytest.approx((1e16 + 4e16 + 9e16) / (0.05e8 + 0.4e8 + 0.9e8))
    with pytest.raises(ValueError):
        cs.fit_load_time([1e8, 1e8], [0.1, 0.2])


def test_network_seconds():
    assert cs.network_seconds(1.25e9, 10) == pytest.approx(1.0)


# -- live migration between two teaching engines ---------------------------------------------------

@pytest.fixture(scope="module")
def engines():
    from mini_engine import LLMEngine
    from reference_server.models import ModelError, resolve_model
    try:
        path = resolve_model("smollm2-135m", prepare=False).path
    except ModelError as exc:
        pytest.skip(f"bundled model not prepared: {exc}")
    torch.set_num_threads(1)
    return (LLMEngine(path, kv_cache_gib=0.02, num_threads=1),
            LLMEngine(path, kv_cache_gib=0.02, num_threads=1, prefix_cache="hash"))


def test_a_migrated_request_goes_on_with_the_sources_tokens(engines):
    source, destination = engines
    rows = cs.migration_sweep(source, destination, [37], decoded=3, follow=4)   # 3 blocks
    assert [(r["method"], r["tokens"]) for r in rows] == [("tokens", 40), ("kv", 40)]
    assert all(r["same tokens as the source"] for r in rows)
    per_token = source.runner.kv_bytes_per_token()
    for r in rows:
        ids = 4 * r["tokens"]                    # int32 token ids
        # the KV of every token but the last, which the destination computes itself
        kv = (r["tokens"] - 1) * per_token if r["method"] == "kv" else 0
        assert r["wire bytes"] == ids + kv
    assert not source.has_unfinished() and not destination.has_unfinished()
    assert destination.block_manager.num_used_blocks() == 0


def test_kv_import_refuses_what_does_not_fit_and_leaves_nothing_behind(engines):
    source, destination = engines
    cs.start_request(source, list(range(100, 130)), decoded=2, request_id="refuse")
    tokens, kv = source.export_kv("refuse")
    free = destination.block_manager.allocator.num_free
    with pytest.raises(ValueError):              # KV for every token: no logits to continue from
        destination.add_request_with_kv(tokens[:-1], kv)
    with pytest.raises(ValueError):              # another model's layer count
        destination.add_request_with_kv(tokens, kv[:-1])
    assert not destination.requests and destination.block_manager.allocator.num_free == free
    source.abort("refuse")
