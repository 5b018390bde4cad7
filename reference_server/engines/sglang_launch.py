"""``python -m reference_server.engines.sglang_launch ARGS``: SGLang's own ``launch_server``
(same arguments, same steps), with ``ChildKeyGuard`` added to its HTTP app.

SGLang's key check leaves ``/health*``, ``/metrics*`` and WebSockets open (see
``child_guard``) and has no option to load a middleware, so the server starts SGLang through
this module, in SGLang's interpreter. The guard takes the key SGLang parsed (our ``--config``
file). It sits on the app that SGLang serves in-process, which is true only of its default
HTTP mode with one tokenizer worker: anything else is refused here rather than run open.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> None:
    import sglang.launch_server as launch  # what `python -m sglang.launch_server` runs
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.utils import kill_process_tree

    load_plugins()
    args = prepare_server_args(argv)
    if not args.api_key:
        sys.exit("sglang_launch: no API key; the reference server passes one in --config")
    if (args.tokenizer_worker_num != 1 or args.encoder_only or args.smg_grpc_mode
            or args.use_ray):
        sys.exit("sglang_launch: only SGLang's default HTTP server with one tokenizer worker "
                 "can be guarded (no --tokenizer-worker-num, --encoder-only, --smg-grpc-mode, "
                 "--use-ray)")
    from sglang.srt.entrypoints.http_server import app

    from reference_server.engines.child_guard import ChildKeyGuard
    app.add_middleware(ChildKeyGuard, key=args.api_key)
    try:
        launch.run_server(args)
    finally:
        kill_process_tree(os.getpid(), include_parent=False)


if __name__ == "__main__":     # SGLang's scheduler processes are spawned: keep this guard
    main(sys.argv[1:])
