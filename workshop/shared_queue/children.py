"""The notebook's child processes (the NATS server, the workers) die with it."""

from __future__ import annotations

import signal


def die_with_parent() -> None:
    """``preexec_fn`` for a child: on Linux it gets SIGTERM when its parent dies, even when
    the parent had no chance to clean up (a kernel killed, marimo's exporter exiting without
    running ``atexit``), so no orphan keeps a port or a copy of the models in memory."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG
    except (OSError, AttributeError):                         # not Linux: atexit only
        pass
