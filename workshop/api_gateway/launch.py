"""Start a gateway process from Python (a notebook, a test) in front of running servers."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import httpx

from reference_server import launch as server_launch
from workshop.api_gateway.__main__ import UPSTREAM_KEYS_ENV


@dataclass
class RunningGateway:
    proc: Any
    base_url: str
    admin_key: str
    log_path: Path
    keys_path: Path

    def stats(self) -> dict:
        r = httpx.get(self.base_url + "/gateway/stats",
                      headers={"Authorization": f"Bearer {self.admin_key}"}, timeout=10)
        r.raise_for_status()
        return r.json()

    def log(self) -> list[dict]:
        from workshop.api_gateway.request_log import read
        return read(self.log_path) if self.log_path.exists() else []

    def stop(self) -> None:
        server_launch.stop(self.proc, timeout=10)
        self.keys_path.unlink(missing_ok=True)

    def __enter__(self) -> "RunningGateway":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start(upstreams: Sequence[tuple[str, str | None]], keys: Sequence[dict], *,
          policy: str = "spread", max_per_replica: int = 8, log_path: str | Path | None = None,
          admin_key: str | None = None, timeout: float = 60.0, prefix_threshold: float = 0.5,
          prefix_balance: int = 4) -> RunningGateway:
    """``python -m workshop.api_gateway`` on a free port in front of ``upstreams`` ((root
    URL, key) pairs). ``keys`` as in the keys file; ``admin_key`` must be one of them with
    ``admin: true`` (to read ``/gateway/stats``). ``prefix_threshold`` and ``prefix_balance``:
    the ``prefix`` policy's (``routing.Prefix``)."""
    if admin_key is None:
        admin_key = next((k["key"] for k in keys if k.get("admin")), None)
    fd, keys_file = tempfile.mkstemp(prefix="gateway-keys-", suffix=".json")
    with os.fdopen(fd, "w") as f:        # mkstemp: readable by this user only
        json.dump({"keys": list(keys)}, f)
    if log_path is None:
        log_path = Path(tempfile.mkdtemp(prefix="gateway-")) / "requests.jsonl"
    log_path = Path(log_path)
    port = server_launch.free_port()
    cmd = [sys.executable, "-m", "workshop.api_gateway", "--keys", keys_file, "--policy",
           policy, "--max-per-replica", str(max_per_replica), "--log", str(log_path),
           "--port", str(port), "--prefix-threshold", str(prefix_threshold),
           "--prefix-balance", str(prefix_balance)]
    for url, _ in upstreams:
        cmd += ["--upstream", url]
    env = {**os.environ, UPSTREAM_KEYS_ENV: ",".join(k or "" for _, k in upstreams)}
    child = server_launch.start(cmd, port, log_path=log_path.with_suffix(".out"), env=env)
    gw = RunningGateway(child.proc, child.base_url, admin_key, log_path, Path(keys_file))
    try:
        child.wait_ready(timeout, path="/health")
    except BaseException:
        gw.stop()
        raise
    return gw
