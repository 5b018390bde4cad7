"""How fast can the harness itself send? Open-loop load against a server that costs nothing.

Starts ``workshop.bench.mock_server`` (plain asyncio, instant SSE replies of a few chunks) in
its own process, then runs the harness open loop (Poisson arrivals) at increasing rates and
reports, for each, the achieved rate and the client's schedule lag. The headroom is the
highest rate whose p99 schedule lag stays under the threshold (target: 300 req/s, 1 ms).

    python benchmarks/client_headroom.py [--rates 100,200,300,400,600,800] [--seconds 5]

On a machine shared with other work the figures move from run to run: take the median of
``--repeats`` runs per rate, and say so when you quote them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

# run from a checkout
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from reference_server import launch  # noqa: E402
from workshop.bench import run_benchmark  # noqa: E402
from workshop.bench.client import SPIN_S  # noqa: E402


def timer_floor(rate: float, seconds: float) -> float:
    """p99 lateness (ms) of a bare asyncio loop waking at ``rate``/s with the harness's timer
    strategy and doing nothing else: what the OS alone costs (high on a busy machine)."""
    import asyncio

    import numpy as np

    async def go() -> float:
        late = []
        t0 = time.perf_counter()
        for i in range(max(int(rate * seconds), 10)):
            due = t0 + i / rate
            wait = due - time.perf_counter() - SPIN_S
            if wait > 0:
                await asyncio.sleep(wait)
            while time.perf_counter() < due:
                await asyncio.sleep(0)
            late.append((time.perf_counter() - due) * 1e3)
        return float(np.percentile(late, 99))
    return asyncio.run(go())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="100,200,300,400,600,800")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of each open-loop run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--output-len", type=int, default=4, help="SSE chunks per reply")
    ap.add_argument("--lag-ms", type=float, default=1.0, help="p99 schedule-lag threshold")
    args = ap.parse_args()

    port = launch.free_port()
    server = launch.start([sys.executable, "-m", "workshop.bench.mock_server", "--port", str(port)],
                          port)
    url = server.base_url
    try:
        server.wait_ready(20, path="/v1/models")
        print(f"# client headroom, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
              f"{os.cpu_count()} CPUs, mock server pid {server.proc.pid}")
        print(f"{'rate':>6} {'achieved':>9} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} "
              f"{'errors':>6} {'floor p99':>9}  (ms; median of {args.repeats}; floor = bare event "
              "loop, no HTTP)")
        best = None
        for rate in [float(r) for r in args.rates.split(",")]:
            rows = []
            for rep in range(args.repeats):
                n = max(int(rate * args.seconds), 10)
                res = run_benchmark(url, "mock", "random", num_requests=n, concurrency=None,
                                    request_rate=rate,
                                    seed=rep, warmup=5, progress=False, tokenizer=None,
                                    environment=False,
                                    input_len=16, output_len=args.output_len)
                s = res.summary
                lags = [r.schedule_lag * 1e3 for r in res.records if not r.warmup]
                # achieved send rate: how many requests went out per second of the schedule
                sent = sorted(r.sent for r in res.records if not r.warmup)
                rows.append((n / (sent[-1] - sent[0]) * (n - 1) / n, s["schedule_lag_ms"]["median"],
                             s["schedule_lag_ms"]["p99"], max(lags), s["errors"]))
            med = [statistics.median(col) for col in zip(*rows)]
            floor = statistics.median(timer_floor(rate, min(args.seconds, 2.0))
                                      for _ in range(args.repeats))
            ok = med[2] < args.lag_ms and med[4] == 0
            print(f"{rate:6.0f} {med[0]:9.1f} {med[1]:8.3f} {med[2]:8.3f} {med[3]:8.2f} "
                  f"{med[4]:6.0f} {floor:9.3f}  {'ok' if ok else 'over'}")
            if ok:
                best = rate
        print(f"highest rate with p99 schedule lag < {args.lag_ms} ms: "
              f"{'none' if best is None else f'{best:.0f} req/s'}")
        return 0
    finally:
        server.stop(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
