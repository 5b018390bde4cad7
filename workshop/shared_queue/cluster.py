"""One machine's worth of the design: a NATS server, a gateway and worker processes, started
together and stopped together (``with Cluster.start(...) as c: ...``)."""

from __future__ import annotations

import atexit
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from workshop.shared_queue import catalog
from workshop.shared_queue.gateway import Gateway
from workshop.shared_queue.nats_server import NatsServer, start_nats
from workshop.shared_queue.worker import WorkerProcess, WorkerSpec, spawn

_RUNNING: list["Cluster"] = []


def stop_all() -> None:
    """Stop every cluster this process started (a notebook cell re-run starts a new one)."""
    while _RUNNING:
        _RUNNING.pop().stop()


@dataclass
class Cluster:
    nats: NatsServer
    gateway: Gateway
    workers: dict[str, WorkerProcess]
    models: dict[str, str]
    sizes: dict[str, int]
    log_dir: Path

    @classmethod
    def start(cls, num_workers: int, num_models: int, budget_models: float,
              pinned: Sequence[str] = (), slots: int = 4, layers: int | None = None,
              max_request_tokens: int = 128, ack_wait: float = 3.0, timeout: float = 300.0,
              log_dir: str | Path | None = None) -> "Cluster":
        """``num_workers`` worker processes, each allowed ``budget_models`` times one model's
        bytes, serving ``num_models`` named copies of the bundled model (``catalog``; cut to
        ``layers`` layers if given)."""
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="workshop-queue-logs-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        models = catalog.model_copies(num_models, layers)
        blocks = catalog.kv_pool_blocks(slots, max_request_tokens)
        sizes = {m: catalog.model_bytes(p, blocks) for m, p in models.items()}
        budget = int(budget_models * max(sizes.values()))
        nats = start_nats(log_path=log_dir / "nats.log")
        gateway = Gateway(nats.url, ack_wait=ack_wait)
        workers = {}
        cluster = cls(nats, gateway, workers, models, sizes, log_dir)
        atexit.register(cluster.stop)
        _RUNNING.append(cluster)
        try:
            for i in range(num_workers):
                spec = WorkerSpec(f"w{i}", nats.url, models, sizes, budget, list(pinned), slots,
                                  blocks, ack_wait)
                gateway.add_worker(spec.id)
                workers[spec.id] = spawn(spec, log_dir / f"{spec.id}.log")
            gateway.wait_ready(list(workers), timeout,
                               alive=lambda: all(w.alive() for w in workers.values()))
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def configure(self, budget_models: float, pinned: Sequence[str] = ()) -> None:
        """New packing policy settings on every live worker (unloads what no longer fits)."""
        budget = int(budget_models * max(self.sizes.values()))
        for w, proc in self.workers.items():
            if proc.alive():
                self.gateway.control(w, "configure", budget=budget, pinned=list(pinned))
                proc.spec.budget, proc.spec.pinned = budget, list(pinned)

    def live(self) -> list[str]:
        return [w for w, p in self.workers.items() if p.alive()]

    def stats(self, reset: bool = True) -> dict[str, dict]:
        return {w: self.gateway.control(w, "stats", reset=reset) for w in self.live()}

    def heal(self, timeout: float = 300.0) -> list[str]:
        """Replace dead workers with fresh processes of the same spec; returns their ids."""
        dead = [w for w, p in self.workers.items() if not p.alive()]
        for w in dead:
            self.gateway.ready.pop(w, None)
            self.workers[w] = spawn(self.workers[w].spec, self.log_dir / f"{w}.log")
        if dead:
            self.gateway.wait_ready(dead, timeout,
                                    alive=lambda: all(self.workers[w].alive() for w in dead))
            self.gateway.workers = sorted(set(self.gateway.workers) | set(dead))
        return dead

    def reset(self) -> None:
        """Between experiments: replace dead workers, empty the queue, drop what workers hold,
        zero their counters."""
        self.heal()
        self.gateway.purge()
        for w in self.live():
            self.gateway.control(w, "flush")
            self.gateway.control(w, "stats", reset=True)

    def kill(self, worker_id: str) -> None:
        self.workers[worker_id].kill()
        self.gateway.workers.remove(worker_id)

    def stop(self) -> None:
        """Idempotent: also registered to run at exit."""
        for w in self.workers.values():
            w.stop()
        self.gateway.close()
        self.nats.stop()

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
