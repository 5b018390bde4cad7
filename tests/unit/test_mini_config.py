"""``EngineConfig`` is the one definition of the engine's switches: the server's engine
flags and the docs table are generated from it."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

from mini_engine.config import EngineConfig, add_cli_arguments, markdown_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "mini_engine.md"
BEGIN, END = "<!-- BEGIN generated: mini_engine.config.markdown_table() -->", \
    "<!-- END generated -->"

# The flags the server has always accepted, with their field: names and meanings stay stable.
FLAGS = {"--compute-dtype": "dtype", "--block-size": "block_size", "--num-blocks": "num_blocks",
         "--max-num-seqs": "max_num_seqs", "--max-num-batched-tokens": "max_num_batched_tokens",
         "--scheduler": "scheduler", "--no-chunked-prefill": "chunked_prefill",
         "--kv-layout": "kv_layout", "--prefix-cache": "prefix_cache", "--spec": "spec",
         "--num-spec-tokens": "num_spec_tokens", "--draft-layers": "draft_layers",
         "--attention": "attention", "--mla-rank": "mla_rank", "--quant": "quant",
         "--no-prepack": "prepack", "--prepack-fp32": "prepack_fp32", "--threads": "num_threads",
         "--decode-attention": "decode_attention", "--solo-threads": "solo_threads",
         "--no-cascade-attention": "cascade_attention", "--block-order": "block_order",
         "--no-keep-freed-memory": "keep_freed_memory",
         "--kv-read": "kv_read",
         "--enable-logging-iteration-details": "log_iteration_details"}


def test_docs_table_is_the_generated_one():
    text = DOCS.read_text()
    assert BEGIN in text and END in text, f"{DOCS} lost its generated-table markers"
    in_docs = text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n") + "\n"
    assert in_docs == markdown_table(), (
        "docs/mini_engine.md's knob table differs from EngineConfig; regenerate it with\n"
        "python -c 'from mini_engine.config import markdown_table; print(markdown_table())'")


def test_every_field_is_documented_and_the_flags_are_stable():
    import argparse
    parser = add_cli_arguments(argparse.ArgumentParser())
    flags = {a.option_strings[0]: a.dest for a in parser._actions if a.option_strings
             and a.dest != "help"}
    assert flags == FLAGS
    for f in fields(EngineConfig):
        assert f.metadata.get("help"), f"EngineConfig.{f.name} has no help text"
        assert f"`{f.name}`" in markdown_table()


def test_from_cli_precedence_flag_over_server_over_default():
    server = dict(dtype="bfloat16", device="cpu", kv_cache_gib=0.5, max_model_len=1024,
                  prefix_cache="hash")
    c = EngineConfig.from_cli([], **server)
    assert (c.dtype, c.kv_cache_gib, c.max_model_len, c.prefix_cache) == ("bfloat16", 0.5, 1024,
                                                                         "hash")
    assert (c.block_size, c.spec, c.quant, c.chunked_prefill) == (16, None, None, True)
    c = EngineConfig.from_cli(["--compute-dtype", "float32", "--prefix-cache", "none",
                               "--spec", "ngram", "--no-chunked-prefill", "--threads", "2",
                               "--num-blocks", "99"], **server)
    assert (c.dtype, c.prefix_cache, c.spec, c.chunked_prefill, c.num_threads, c.num_blocks) \
        == ("float32", None, "ngram", False, 2, 99)
    assert EngineConfig.from_cli(["--compute-dtype", "auto"], **server).dtype == "bfloat16"
    # a switch off by default: its flag turns it on
    assert EngineConfig.from_cli([]).log_iteration_details is False
    assert EngineConfig.from_cli(["--enable-logging-iteration-details"]).log_iteration_details
    assert EngineConfig.from_cli([]).prepack_fp32 is False
    assert EngineConfig.from_cli(["--prepack-fp32"]).prepack_fp32
    # the no-sharing baseline drops the server's default prefix cache ...
    assert EngineConfig.from_cli(["--kv-layout", "contiguous"], **server).prefix_cache is None
    # ... but an explicit contradiction is an error, not silently dropped
    with pytest.raises(ValueError):
        EngineConfig.from_cli(["--kv-layout", "contiguous", "--prefix-cache", "hash"], **server)


@pytest.mark.parametrize("argv", [["--spec", "medusa"], ["--block-size", "x"], ["--nope"],
                                  ["--compute-dtype", "int3"], ["--attention"]])
def test_bad_flags_are_value_errors(argv):
    with pytest.raises(ValueError):
        EngineConfig.from_cli(argv)


def test_offline_config_is_validated():
    with pytest.raises(ValueError):
        EngineConfig(quant="int2").validate()
    EngineConfig(quant="none", spec=None, dtype="bf16").validate()
    assert re.search(r"\| `--spec` \| `spec` \| `none`, `ngram`, `self`", markdown_table())
