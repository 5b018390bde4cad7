"""``python -m reference_server`` / ``reference-server``: start the engine and serve it."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import uvicorn

from reference_server import launch
from reference_server.app import create_app
from reference_server.config import parse_args


async def serve(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    if config.engine == "hf":
        # Before torch loads: OpenMP's default busy-waiting makes one-request-at-a-time
        # decoding several times slower on a small CPU shared with other processes, and the
        # baseline should be naive, not handicapped.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one line per proxied call is noise
    for flag, env in (("--api-key", "WORKSHOP_API_KEY"),
                      ("--upstream-api-key", "WORKSHOP_UPSTREAM_API_KEY")):
        if any(a == flag or a.startswith(flag + "=") for a in (argv or sys.argv[1:])):
            logging.getLogger("reference_server").warning(
                "%s on the command line is visible to every user of this machine (ps); "
                "set %s instead", flag, env)
    app = create_app(config)
    server = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port,
                                           log_level=config.log_level, access_log=False,
                                           timeout_graceful_shutdown=10))
    state = app.state.server

    async def exit_on_fatal() -> None:
        await state.fatal.wait()
        server.should_exit = True

    def launcher_gone(pid: int) -> None:
        logging.getLogger("reference_server").warning(
            "the process that started this server (pid %d) is gone: shutting down", pid)
        server.should_exit = True

    watchers = [asyncio.create_task(exit_on_fatal())]
    watcher = launch.watch_launcher(launcher_gone)
    if watcher is not None:
        watchers.append(watcher)
    await server.serve()
    for w in watchers:
        w.cancel()
    return 1 if state.fatal.is_set() else 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(asyncio.run(serve(argv)))


if __name__ == "__main__":   # vLLM's engine core is a spawned process: keep this guard
    main()
