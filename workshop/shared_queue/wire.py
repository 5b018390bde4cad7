"""What travels on the queue, and what it costs to put it there.

A request and its reply are MessagePack maps. Token ids travel as packed little-endian
int32 bytes (MessagePack's ``bin`` type: the bytes themselves, plus a 1-5 byte header), not
as a list of numbers. The gateway's annotations (the model, the request's size) go in NATS
headers and the subject, so a router or a worker can read them without decoding the body.

``encoders()`` is the comparison the notebook measures: the same binary payload as a JSON
list of numbers, as base64 text inside JSON (what a JSON-only API must do with bytes), and
as MessagePack ``bin``.
"""

from __future__ import annotations

import base64
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import msgpack
import numpy as np

# NATS headers the gateway sets on every request.
MODEL_HEADER = "Workshop-Model"
SIZE_HEADER = "Workshop-Size"        # prompt tokens + max_tokens: the work it asks for
REPLY_HEADER = "Workshop-Reply"      # core-NATS subject the worker sends the reply to


def pack_ids(ids) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def unpack_ids(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<i4").tolist()


@dataclass
class Request:
    id: str
    model: str
    prompt: list[int]
    max_tokens: int
    sent: float = 0.0                 # gateway's time.time() at publish

    @property
    def size(self) -> int:
        return len(self.prompt) + self.max_tokens

    def encode(self) -> bytes:
        return msgpack.packb({"id": self.id, "model": self.model, "prompt": pack_ids(self.prompt),
                              "max_tokens": self.max_tokens, "sent": self.sent})

    @classmethod
    def decode(cls, data: bytes) -> "Request":
        d = msgpack.unpackb(data)
        return cls(d["id"], d["model"], unpack_ids(d["prompt"]), d["max_tokens"], d["sent"])


@dataclass
class Reply:
    id: str
    worker: str
    tokens: list[int] = field(default_factory=list)
    error: str | None = None
    delivered: int = 1                # how many times the queue handed this request out
    hit: bool = True                  # its model was already in the worker's memory
    load_s: float = 0.0               # seconds spent loading its model (0 on a hit)
    pulled: float = 0.0               # worker's time.time() when it pulled the request
    finished: float = 0.0             # ... when the engine produced its last token

    def encode(self) -> bytes:
        d = asdict(self)
        d["tokens"] = pack_ids(self.tokens)
        return msgpack.packb(d)

    @classmethod
    def decode(cls, data: bytes) -> "Reply":
        d = msgpack.unpackb(data)
        d["tokens"] = unpack_ids(d["tokens"])
        return cls(**d)


def control(cmd: str, **args: Any) -> bytes:
    return msgpack.packb({"cmd": cmd, **args})


def decode(data: bytes) -> Any:
    return msgpack.unpackb(data)


def encode(obj: Any) -> bytes:
    return msgpack.packb(obj)


# -- MessagePack vs base64-in-JSON --------------------------------------------------------------

def encoders() -> dict[str, tuple[Callable[[np.ndarray], bytes],
                                  Callable[[bytes, np.ndarray], np.ndarray]]]:
    """name -> (encode(array) -> bytes, decode(bytes, like) -> array), for one binary payload
    (an array: token ids, an embedding batch, image bytes) inside a small message."""

    def json_list(a):
        return json.dumps({"dtype": a.dtype.str, "shape": a.shape,
                           "data": a.ravel().tolist()}).encode()

    def json_list_back(b, like):
        d = json.loads(b)
        return np.asarray(d["data"], dtype=d["dtype"]).reshape(d["shape"])

    def json_b64(a):
        return json.dumps({"dtype": a.dtype.str, "shape": a.shape,
                           "data": base64.b64encode(a.tobytes()).decode("ascii")}).encode()

    def json_b64_back(b, like):
        d = json.loads(b)
        return np.frombuffer(base64.b64decode(d["data"]), dtype=d["dtype"]).reshape(d["shape"])

    def mp_bin(a):
        return msgpack.packb({"dtype": a.dtype.str, "shape": a.shape, "data": a.tobytes()})

    def mp_bin_back(b, like):
        d = msgpack.unpackb(b)
        return np.frombuffer(d["data"], dtype=d["dtype"]).reshape(d["shape"])

    return {"JSON, list of numbers": (json_list, json_list_back),
            "JSON, base64 string": (json_b64, json_b64_back),
            "MessagePack, bin": (mp_bin, mp_bin_back)}


def example_payloads(rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
    """Binary payloads an inference queue carries: what each is, as an array."""
    rng = rng or np.random.default_rng(0)
    return {"prompt: 2,048 token ids (int32)": rng.integers(0, 49_152, 2048, dtype=np.int32),
            "embeddings: 32 x 768 (float32)": rng.standard_normal((32, 768)).astype(np.float32),
            "image: 256 KiB of JPEG-like bytes": rng.integers(0, 256, 256 * 1024, dtype=np.uint8)}


def best_seconds(fn: Callable[[], Any], repeat: int = 5, min_time: float = 0.02) -> float:
    """Best time of ``fn`` over ``repeat`` rounds, each round looping until ``min_time``."""
    best = float("inf")
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if dt >= min_time:
                break
        best = min(best, dt / n)
    return best


def compare_encodings(payloads: dict[str, np.ndarray], repeat: int = 5,
                      min_time: float = 0.02) -> list[dict]:
    """Size, encode and decode time of every payload in every encoding; checks each round
    trip returns the same array."""
    rows = []
    for what, arr in payloads.items():
        raw = arr.nbytes
        for name, (enc, dec) in encoders().items():
            blob = enc(arr)
            if not np.array_equal(dec(blob, arr), arr):
                raise AssertionError(f"{name} did not round-trip {what}")
            rows.append({"payload": what, "encoding": name, "raw bytes": raw,
                         "encoded bytes": len(blob), "size / raw": len(blob) / raw,
                         "encode us": best_seconds(lambda: enc(arr), repeat, min_time) * 1e6,
                         "decode us": best_seconds(lambda: dec(blob, arr), repeat, min_time) * 1e6})
    return rows


def base64_size(n: int) -> int:
    """Bytes of the base64 text for ``n`` raw bytes: every 3 bytes become 4 characters."""
    return 4 * ((n + 2) // 3)
