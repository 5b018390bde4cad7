"""Cold starts: how long a checkpoint takes to load, and moving a running request elsewhere.

Notebook 13's helpers. Three parts:

* **Formats.** The same state dict written as ``torch.save`` (read by ``torch.load``, with
  and without ``mmap=True``), as safetensors, and in a loading-optimised layout of our own
  (``write_packed``: every tensor in one aligned, contiguous data area behind a name ->
  offset index, read with a few large sequential or parallel reads into one buffer, tensors
  made as views of it: the idea of ServerlessLLM's checkpoint format, Fu et al., OSDI 2024).
  Every timed load ends with ``checksum``, which reads every byte, so a lazy (mmap) load
  pays for its page faults inside the timing instead of looking free.
* **Cold and warm.** ``drop_page_cache`` evicts one file from the kernel's page cache
  (fsync, then ``posix_fadvise(DONTNEED)``: no root needed, unlike ``drop_caches``);
  ``resident_fraction`` asks the kernel (``mincore``) how much of the file is still cached,
  so the notebook can verify that "cold" was cold.
* **Live migration.** A request running on one teaching engine continues on another, either
  from its token ids (the destination recomputes the KV cache: a prefill) or from a copy of
  its KV cache (``LLMEngine.export_kv`` / ``add_request_with_kv``): bytes on the wire against
  seconds of compute.

The fit ``load time = fixed + size / bandwidth`` is ``fit_load_time``; what to conclude
from any of it is the notebook's business.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import statistics
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

FORMATS = ("torch.load", "torch.load(mmap=True)", "safetensors", "packed")
FILE_NAMES = {"torch.load": "model.pt", "torch.load(mmap=True)": "model.pt",
              "safetensors": "model.safetensors", "packed": "model.packed"}
COLORS = {"torch.load": "#d62728", "torch.load(mmap=True)": "#ff7f0e",
          "safetensors": "#1f77b4", "packed": "#2ca02c"}

PACKED_MAGIC = b"WKPACK01"
ALIGN = 64    # every tensor starts on a 64-byte boundary: a valid view for any dtype, SIMD-aligned
MiB = 1 << 20


# -- the checkpoint ----------------------------------------------------------------------------

def read_safetensors_folder(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in a model folder, in file order."""
    from safetensors.torch import load_file
    sd: dict[str, torch.Tensor] = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        sd.update(load_file(str(f)))
    if not sd:
        raise FileNotFoundError(f"no *.safetensors in {folder}")
    return sd


def nbytes(sd: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in sd.values())


def resized(sd: dict[str, torch.Tensor], target: int) -> dict[str, torch.Tensor]:
    """A checkpoint of at most ``target`` bytes made of ``sd``'s tensors, taken in order, each
    that still fits (the smallest alone if none does); past ``sd``'s own size, copies of them
    (``copy1.name``, ...). Copies are clones: ``torch.save`` would store a shared tensor once."""
    out: dict[str, torch.Tensor] = {}
    total, round_ = 0, 0
    while True:
        before, taken = total, 0
        for name, t in sd.items():
            if total + t.nbytes <= target:
                out[f"copy{round_}.{name}" if round_ else name] = t.clone() if round_ else t
                total += t.nbytes
                taken += 1
        if taken < len(sd) or total == before:     # full: copies only of a whole checkpoint
            break
        round_ += 1
    if not out:
        name = min(sd, key=lambda k: sd[k].nbytes)
        out[name] = sd[name]
    return out


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 tensor (a view when it is contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def checksum(sd: dict[str, torch.Tensor]) -> int:
    """Sum of every byte of every tensor, as 64-bit words (wrapping): reads all the data, at
    memory speed (NumPy's uint64 sum; torch's integer sums are several times slower)."""
    total = 0
    for t in sd.values():
        a = as_bytes(t).numpy()
        whole = a.size // 8 * 8
        total += int(a[:whole].view(np.uint64).sum(dtype=np.uint64)) + int(a[whole:].sum())
    return total & (2**64 - 1)


def same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Same names, dtypes, shapes and bits (NaNs compare equal: it is the bytes that count)."""
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape
        and torch.equal(as_bytes(a[k]), as_bytes(b[k]))
        for k in a)


# -- the packed layout ---------------------------------------------------------------------------
#
#   magic (8 bytes) | header length (8 bytes, little endian) | header (JSON) | padding
#   | data: tensor after tensor, each at an ALIGN-ed offset from the start of the data area
#
# The header names each tensor's dtype, shape, offset and size: one small read finds every
# tensor, and the data area can be read in chunks of any size, in any order, by any number of
# threads, straight into one buffer whose slices become the tensors.

def _round_up(n: int, to: int = ALIGN) -> int:
    return -(-n // to) * to


def packed_index(sd: dict[str, torch.Tensor]) -> tuple[dict[str, dict], int]:
    """``({name: {dtype, shape, offset, nbytes}}, data bytes)``: where each tensor goes."""
    index, offset = {}, 0
    for name, t in sd.items():
        index[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
                       "offset": offset, "nbytes": t.nbytes}
        offset = _round_up(offset + t.nbytes)
    return index, offset


def write_packed(sd: dict[str, torch.Tensor], path: str | Path) -> Path:
    index, data_bytes = packed_index(sd)
    header = json.dumps({"tensors": index, "data_bytes": data_bytes}).encode()
    start = _round_up(16 + len(header))
    path = Path(path)
    with open(path, "wb") as f:
        f.write(PACKED_MAGIC + struct.pack("<Q", len(header)) + header)
        f.write(b"\0" * (start - f.tell()))
        for name, t in sd.items():
            f.seek(start + index[name]["offset"])
            f.write(as_bytes(t).numpy().tobytes())
        f.truncate(start + data_bytes)
    return path


def read_packed_index(path: str | Path) -> tuple[dict[str, dict], int, int]:
    """``(index, where the data area starts, its size)`` from a packed file's header."""
    with open(path, "rb") as f:
        head = f.read(16)
        if head[:8] != PACKED_MAGIC:
            raise ValueError(f"{path} is not a packed checkpoint")
        (length,) = struct.unpack("<Q", head[8:])
        meta = json.loads(f.read(length))
    return meta["tensors"], _round_up(16 + length), meta["data_bytes"]


def load_packed(path: str | Path, chunk_mib: float = 16,
                threads: int = 1) -> dict[str, torch.Tensor]:
    """Read the data area in chunks of ``chunk_mib`` MiB (``threads`` at a time: ``os.preadv``
    releases the GIL) into one buffer, and return the tensors as views of it: no copy after
    the read, no per-tensor file access."""
    index, start, size = read_packed_index(path)
    buf = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    chunk = max(4096, int(chunk_mib * MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        def read(offset: int) -> None:
            end = min(offset + chunk, size)
            while offset < end:     # a read may return less than asked
                got = os.preadv(fd, [view[offset:end]], start + offset)
                if got <= 0:
                    raise EOFError(f"{path} ends before its header says")
                offset += got
        offsets = range(0, size, chunk)
        if threads > 1:
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(read, offsets))
        else:
            for o in offsets:
                read(o)
    finally:
        os.close(fd)
    return {name: buf[m["offset"]:m["offset"] + m["nbytes"]].view(getattr(torch, m["dtype"]))
            .view(m["shape"]) for name, m in index.items()}


# -- writing and loading every format --------------------------------------------------------------

def write_formats(sd: dict[str, torch.Tensor], folder: str | Path) -> dict[str, Path]:
    """The checkpoint in every format under ``folder``: ``{format: file}`` (both torch.load
    variants read the same ``model.pt``)."""
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(sd, folder / FILE_NAMES["torch.load"])
    save_file({k: v.contiguous() for k, v in sd.items()}, str(folder / FILE_NAMES["safetensors"]))
    write_packed(sd, folder / FILE_NAMES["packed"])
    return {fmt: folder / FILE_NAMES[fmt] for fmt in FORMATS}


def load(fmt: str, path: str | Path, chunk_mib: float = 16,
         threads: int = 1) -> dict[str, torch.Tensor]:
    """``path`` loaded the way ``fmt`` names (``chunk_mib`` and ``threads``: packed only)."""
    if fmt == "torch.load":
        return torch.load(path, map_location="cpu", weights_only=True)
    if fmt == "torch.load(mmap=True)":
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if fmt == "safetensors":
        from safetensors.torch import load_file
        return load_file(str(path))
    if fmt == "packed":
        return load_packed(path, chunk_mib, threads)
    raise ValueError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


# -- the page cache ------------------------------------------------------------------------------

def drop_page_cache(path: str | Path) -> None:
    """Evict ``path`` from the kernel's page cache. Dirty pages cannot be dropped, hence the
    fsync first; pages another process has mapped stay (the kernel treats DONTNEED as advice)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def resident_fraction(path: str | Path) -> float:
    """Share of ``path``'s pages in the page cache right now, from ``mincore(2)`` on a fresh
    read-only mapping (mapping touches nothing). NaN where the kernel does not say."""
    size = os.path.getsize(path)
    if size == 0:
        return 1.0
    libc = _libc()
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return float("nan")
        try:
            pages = -(-size // mmap.PAGESIZE)
            vec = ctypes.create_string_buffer(pages)
            if libc.mincore(addr, size, vec) != 0:
                return float("nan")
            return sum(b & 1 for b in vec.raw) / pages
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def read_seconds(path: str | Path, chunk_mib: float = 16) -> float:
    """Seconds to read every byte of ``path`` with plain sequential reads."""
    buf = bytearray(int(chunk_mib * MiB))
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def page_cache_check(path: str | Path, chunk_mib: float = 16) -> dict:
    """Drop ``path``, then read it twice: how much was cached after the drop and after each
    read, and how long each read took. A first read slower than the second, and a resident
    share near 0 after the drop, mean the drop worked."""
    drop_page_cache(path)
    after_drop = resident_fraction(path)
    first = read_seconds(path, chunk_mib)
    after_first = resident_fraction(path)
    second = read_seconds(path, chunk_mib)
    size = os.path.getsize(path)
    return {"file MiB": size / MiB, "cached after drop": after_drop,
            "first read (s)": first, "first read GB/s": size / first / 1e9,
            "cached after first read": after_first,
            "second read (s)": second, "second read GB/s": size / second / 1e9}


def fresh_memory_seconds(size: int) -> float:
    """Seconds to allocate ``size`` bytes and touch each page once: what a loader that reads
    into new memory pays before the first byte arrives (the kernel maps and zeroes every
    page), and what an mmap of cached pages or a buffer allocated in advance does not."""
    t0 = time.perf_counter()
    buf = torch.empty(size, dtype=torch.uint8)
    buf.numpy()[::mmap.PAGESIZE] = 0
    seconds = time.perf_counter() - t0
    del buf
    return seconds


# -- timing loads ------------------------------------------------------------------------------

def time_load(fmt: str, path: str | Path, cold: bool, chunk_mib: float = 16,
              threads: int = 1) -> dict:
    """One load of ``path`` as ``fmt``, every byte read (``checksum``), cold (page cache dropped
    first) or warm (read once first). Returns seconds, the cached share when it began, and
    the checksum."""
    if cold:
        drop_page_cache(path)
    else:
        read_seconds(path)
    cached = resident_fraction(path)
    t0 = time.perf_counter()
    sd = load(fmt, path, chunk_mib, threads)
    total = checksum(sd)
    seconds = time.perf_counter() - t0
    del sd       # tensors hold no cycles: freed here, before the next load
    return {"seconds": seconds, "cached before": cached, "checksum": total}


def measure_formats(paths: dict[str, Path], repeats: int, chunk_mib: float = 16, threads: int = 1,
                    progress: Callable[[Iterable], Iterable] = iter) -> list[dict]:
    """Every format, cold and warm, ``repeats`` times, interleaved (so a slow moment of a shared
    machine hits every format alike); one row per format and state, medians."""
    runs: dict[tuple[str, str], list[dict]] = {}
    plan = [(r, fmt, state) for r in range(repeats) for fmt in paths for state in ("cold", "warm")]
    for _, fmt, state in progress(plan):
        runs.setdefault((fmt, state), []).append(
            time_load(fmt, paths[fmt], state == "cold", chunk_mib, threads))
    rows = []
    for (fmt, state), got in runs.items():
        size = os.path.getsize(paths[fmt])
        seconds = statistics.median(g["seconds"] for g in got)
        rows.append({"format": fmt, "state": state, "file MiB": size / MiB,
                     "seconds (median)": seconds, "seconds (min)": min(g["seconds"] for g in got),
                     "GB/s": size / seconds / 1e9,
                     "cached before (mean)": statistics.fmean(g["cached before"] for g in got),
                     "checksums agree": len({g["checksum"] for g in got}) == 1})
    return rows


def size_sweep(sd: dict[str, torch.Tensor], sizes: Sequence[int], formats: Sequence[str],
               folder: str | Path, repeats: int, cold: bool = True, chunk_mib: float = 16,
               threads: int = 1, progress: Callable[[Iterable], Iterable] = iter) -> list[dict]:
    """Cold (or warm) load time of checkpoints of about each of ``sizes`` bytes, per format:
    the fastest of ``repeats`` (a shared machine only ever adds time). The files are written
    one size at a time and deleted after."""
    rows = []
    for size in progress(list(sizes)):
        part = resized(sd, size)
        paths = write_formats(part, Path(folder) / f"sweep-{size}")
        try:
            for fmt in formats:
                got = [time_load(fmt, paths[fmt], cold, chunk_mib, threads)["seconds"]
                       for _ in range(repeats)]
                rows.append({"format": fmt, "bytes": os.path.getsize(paths[fmt]),
                             "seconds": min(got)})
        finally:
            remove(paths.values())
        del part
    return rows


def remove(paths: Iterable[Path]) -> None:
    for p in set(paths):
        Path(p).unlink(missing_ok=True)
        try:
            Path(p).parent.rmdir()
        except OSError:
            pass


# -- the fit ---------------------------------------------------------------------------------------

@dataclass
class LoadFit:
    """``seconds = fixed_s + bytes / bandwidth`` (bandwidth in bytes/s), least squares with
    ``fixed_s >= 0``."""

    fixed_s: float
    bandwidth: float
    r2: float
    points: int

    def predict(self, size: float) -> float:
        return self.fixed_s + size / self.bandwidth


def fit_load_time(sizes: Sequence[float], seconds: Sequence[float]) -> LoadFit:
    """The straight line through (bytes, seconds): intercept = fixed cost, 1 / slope =
    bandwidth. No load takes negative time: where the free line's intercept is negative, the
    line is refitted through the origin (least squares with ``fixed_s >= 0``). Needs two sizes
    at least."""
    x, y = np.asarray(sizes, float), np.asarray(seconds, float)
    if len(set(x.tolist())) < 2:
        raise ValueError("a fit needs loads of at least two different sizes")
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:
        slope, intercept = float((x * y).sum() / (x * x).sum()), 0.0
    residual = y - (intercept + slope * x)
    spread = ((y - y.mean()) ** 2).sum()
    r2 = 1 - (residual ** 2).sum() / spread if spread > 0 else 1.0
    return LoadFit(float(intercept), float(1 / slope) if slope > 0 else float("inf"),
                   float(r2), len(x))


# -- live migration --------------------------------------------------------------------------------

def start_request(engine, prompt: list[int], decoded: int, request_id: str, more: int = 4) -> None:
    """Run ``prompt`` on ``engine`` (greedy, no stop token) until it has decoded ``decoded``
    tokens: a request in the middle of its answer, ready to move, with ``more`` to go."""
    from mini_engine import SamplingParams
    engine.add_request(prompt, SamplingParams(max_tokens=decoded + more, ignore_eos=True),
                       request_id)
    seq = engine.requests[request_id]
    while seq.num_output_tokens < decoded:
        engine.step()


def kv_to_bytes(kv: list[list[torch.Tensor]]) -> bytes:
    """The KV tensors as one byte string, as they would cross a network (shapes and dtypes
    travel separately: they are the same for every request of a model)."""
    return b"".join(as_bytes(t).numpy().tobytes()
                    for layer in kv for t in layer)


def kv_from_bytes(data: bytes, like: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Tensors shaped like ``like`` from ``kv_to_bytes``'s output (a copy: the bytes arrived
    in a network buffer)."""
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    out, pos = [], 0
    for layer in like:
        row = []
        for t in layer:
            row.append(flat[pos:pos + t.nbytes].view(t.dtype).view(t.shape))
            pos += t.nbytes
        out.append(row)
    return out


def migrate(source, destination, request_id: str, method: str, follow: int = 4) -> dict:
    """Move ``request_id`` (running on ``source``) to ``destination`` by ``method``:

    * ``"tokens"``: send the token ids (4 bytes each); the destination recomputes their KV
      in a prefill, then samples the next token;
    * ``"kv"``: send the token ids and the KV cache of every computed token; the destination
      writes it into its own blocks and computes only the last token.

    Timed from the source's state to the destination's first new token (the network is not
    in it: the bytes are counted instead). The source keeps the request, so its own next
    tokens can be compared: ``follow`` tokens are generated on the destination."""
    from mini_engine import SamplingParams
    params = SamplingParams(max_tokens=follow, ignore_eos=True)
    new_id = f"{request_id}-via-{method}"
    t0 = time.perf_counter()
    token_ids, kv = source.export_kv(request_id) if method == "kv" else (
        list(source.requests[request_id].token_ids), None)
    wire = np.asarray(token_ids, dtype=np.int32).tobytes()
    if method == "kv":
        payload = kv_to_bytes(kv)
        arrived = kv_from_bytes(payload, kv)
        destination.add_request_with_kv(np.frombuffer(wire, np.int32).tolist(), arrived,
                                        params, new_id)
        wire_bytes = len(wire) + len(payload)
    elif method == "tokens":
        destination.add_request(np.frombuffer(wire, np.int32).tolist(), params, new_id)
        wire_bytes = len(wire)
    else:
        raise ValueError(f"unknown migration method {method!r}: tokens | kv")
    seq = destination.requests[new_id]
    while seq.num_output_tokens == 0:
        destination.step()
    seconds = time.perf_counter() - t0
    while not seq.finished:
        destination.step()
    return {"method": method, "tokens": len(token_ids), "wire bytes": wire_bytes,
            "seconds to next token": seconds, "continuation": seq.output_token_ids}


def continue_on_source(source, request_id: str, follow: int = 4) -> list[int]:
    """The next ``follow`` tokens of ``request_id`` where it runs; then it is finished there."""
    seq = source.requests[request_id]
    start = seq.num_output_tokens
    while seq.num_output_tokens < start + follow:
        source.step()
    tokens = seq.output_token_ids[start:start + follow]
    source.abort(request_id)
    return tokens


def migration_sweep(source, destination, lengths: Sequence[int], decoded: int = 4,
                    follow: int = 4, seed: int = 0,
                    progress: Callable[[Iterable], Iterable] = iter) -> list[dict]:
    """For each prompt length: a request decodes ``decoded`` tokens on ``source``, then moves
    to ``destination`` by tokens and by KV copy. Rows: method, tokens, bytes, seconds, and
    whether the destination went on with the very tokens the source produced."""
    from mini_engine import SamplingParams
    for engine in (source, destination):     # first steps pay one-time set-up: not timed
        engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2, ignore_eos=True))
    vocab = source.runner.cfg.vocab_size
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n in progress(list(lengths)):
        prompt = torch.randint(0, vocab, (n,), generator=gen).tolist()
        rid = f"live-{n}"
        start_request(source, prompt, decoded, rid, more=follow)
        moved = [migrate(source, destination, rid, method, follow) for method in ("tokens", "kv")]
        own = continue_on_source(source, rid, follow)
        for m in moved:
            rows.append({"method": m["method"], "tokens": m["tokens"],
                         "wire bytes": m["wire bytes"],
                         "seconds to next token": m["seconds to next token"],
                         "same tokens as the source": m["continuation"] == own})
    return rows


# -- figures ---------------------------------------------------------------------------------------

def formats_figure(rows: list[dict]):
    from workshop.plots import figure
    fig, ax = figure("Loading the same checkpoint, every byte read", "format",
                     "seconds (median)", size=(8, 4.2))
    fmts = list(dict.fromkeys(r["format"] for r in rows))
    by = {(r["format"], r["state"]): r["seconds (median)"] for r in rows}
    x = np.arange(len(fmts))
    for i, (state, hatch) in enumerate((("cold", ""), ("warm", "//"))):
        vals = [by.get((f, state), np.nan) for f in fmts]
        bars = ax.bar(x + (i - 0.5) * 0.38, vals, 0.38, label=f"{state} page cache",
                      color=[COLORS.get(f, "grey") for f in fmts], alpha=1.0 if state == "cold"
                      else 0.55,
                      hatch=hatch, edgecolor="black", linewidth=0.5)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(x, fmts)
    # headroom above the tallest bar for the legend, so it never covers a bar
    ax.set_ylim(0, np.nanmax(list(by.values())) * 1.3)
    ax.legend(loc="upper center", ncol=2)
    return fig


def fit_figure(rows: list[dict], fits: dict[str, LoadFit],
               extra: tuple[float, float] | None = None):
    """Measured (bytes, seconds) per format with each fitted line; ``extra``: one more
    measured point (bytes, seconds) to show against the lines (the exercise's)."""
    from workshop.plots import figure
    fig, ax = figure("Cold load time vs checkpoint size: fixed cost + size / bandwidth",
                     "checkpoint size (MiB)", "seconds")
    top = max([r["bytes"] for r in rows] + ([extra[0]] if extra else []))
    xs = np.linspace(0, top * 1.05, 50)
    for fmt, fit in fits.items():
        pts = [r for r in rows if r["format"] == fmt]
        c = COLORS.get(fmt, "grey")
        ax.plot([r["bytes"] / MiB for r in pts], [r["seconds"] for r in pts], "o", color=c)
        ax.plot(xs / MiB, [fit.predict(v) for v in xs], "-", color=c, alpha=0.7,
                label=f"{fmt}: {fit.fixed_s * 1e3:.0f} ms + size / {fit.bandwidth / 1e9:.2f} GB/s")
    if extra:
        ax.plot([extra[0] / MiB], [extra[1]], "k*", markersize=12,
                label="the exercise's load (measured)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return fig


def migration_figure(rows: list[dict], link_gbps: float):
    """Bytes on the wire (left) and seconds to the next token (right) per method and length;
    on the right, KV copy also with the network time of a ``link_gbps`` link added."""
    from workshop.plots import new_figure
    fig = new_figure((10, 4.2))
    left, right = fig.subplots(1, 2)
    styles = {"tokens": ("#2ca02c", "resend token ids, recompute KV"),
              "kv": ("#9467bd", "copy the KV cache")}
    for method, (c, label) in styles.items():
        pts = sorted((r for r in rows if r["method"] == method), key=lambda r: r["tokens"])
        n = [r["tokens"] for r in pts]
        left.plot(n, [r["wire bytes"] for r in pts], "o-", color=c, label=label)
        right.plot(n, [r["seconds to next token"] for r in pts], "o-", color=c,
                   label=f"{label} (measured)")
        if method == "kv":
            right.plot(n, [r["seconds to next token"] + network_seconds(r["wire bytes"], link_gbps)
                           for r in pts], "o--", color=c, alpha=0.6,
                       label=f"{label} + wire at {link_gbps:g} Gb/s (computed)")
    right.set_ylim(bottom=0)
    left.set_yscale("log")
    left.set(title="What crosses the network", xlabel="tokens in the request", ylabel="bytes")
    right.set(title="Until the destination's next token", xlabel="tokens in the request",
              ylabel="seconds")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def network_seconds(size: float, gbps: float) -> float:
    """Seconds ``size`` bytes take on a link of ``gbps`` gigabits per second (bandwidth only)."""
    return size * 8 / (gbps * 1e9)
