"""``python -m workshop.api_gateway --upstream URL [--upstream URL ...] --keys FILE
--policy spread|concentrate|round_robin|prefix --log FILE``

The replicas' own keys come by environment, never by flag (a flag shows in ``ps``):
``WORKSHOP_UPSTREAM_API_KEYS``, one key for every replica or one per ``--upstream`` in
order, comma-separated.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

UPSTREAM_KEYS_ENV = "WORKSHOP_UPSTREAM_API_KEYS"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from workshop.api_gateway.routing import POLICIES

    p = argparse.ArgumentParser(prog="python -m workshop.api_gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upstream", action="append", required=True,
                   help="an OpenAI-compatible replica's root URL (repeat for each replica)")
    p.add_argument("--keys", required=True, help="the API keys file (.json or .toml)")
    p.add_argument("--policy", choices=POLICIES, default="spread")
    p.add_argument("--max-per-replica", type=int, default=8,
                   help="concentrate: outstanding requests a replica takes before the next "
                        "one gets any")
    p.add_argument("--prefix-threshold", type=float, default=0.5,
                   help="prefix: the share of a prompt's chunks a replica must have seen from "
                        "the start to get it")
    p.add_argument("--prefix-balance", type=int, default=4,
                   help="prefix: the most outstanding requests the best-matching replica may "
                        "hold beyond the least-loaded's before the request goes to the latter")
    p.add_argument("--log", default=None, help="request log (JSON lines; no prompt text)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    return p.parse_args(argv)


def upstream_keys(n: int, env: dict[str, str]) -> list[str | None]:
    raw = env.get(UPSTREAM_KEYS_ENV, "")
    keys = [k.strip() or None for k in raw.split(",")] if raw else [None]
    if len(keys) == 1:
        return keys * n
    if len(keys) != n:
        raise SystemExit(f"{UPSTREAM_KEYS_ENV} holds {len(keys)} keys for {n} upstreams")
    return keys


async def serve(argv: list[str] | None = None) -> int:
    import uvicorn

    from workshop.api_gateway.app import Gateway, create_app
    from workshop.api_gateway.keys import load_keys

    args = parse_args(argv)
    keys = load_keys(args.keys)
    gw = Gateway(list(zip(args.upstream, upstream_keys(len(args.upstream), dict(os.environ)))),
                 keys, policy=args.policy, max_per_replica=args.max_per_replica,
                 log_path=args.log, prefix_threshold=args.prefix_threshold,
                 prefix_balance=args.prefix_balance)
    server = uvicorn.Server(uvicorn.Config(create_app(gw), host=args.host, port=args.port,
                                           log_level="warning", access_log=False))
    print(f"gateway on http://{args.host}:{args.port}: {len(args.upstream)} replicas, "
          f"policy {args.policy}, {len(keys)} keys", flush=True)
    from reference_server import launch

    def launcher_gone(pid: int) -> None:
        server.should_exit = True

    # Linux: the kernel's SIGTERM ends serve() when the launcher dies; elsewhere this polls it
    watcher = launch.watch_launcher(launcher_gone)
    await server.serve()
    if watcher is not None:
        watcher.cancel()
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(asyncio.run(serve(argv)))


if __name__ == "__main__":
    main()
