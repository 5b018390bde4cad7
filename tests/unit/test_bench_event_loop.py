"""run_sync: a coroutine's result from plain code, with and without a running event loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from workshop.bench.event_loop import run_sync


async def _where(value):
    await asyncio.sleep(0)
    return value, threading.current_thread()


async def _fails():
    await asyncio.sleep(0)
    raise KeyError("inside")


def test_without_a_running_loop_it_runs_here():
    value, thread = run_sync(_where(42))
    assert value == 42 and thread is threading.current_thread()
    with pytest.raises(KeyError, match="inside"):
        run_sync(_fails())


def test_inside_a_running_loop_it_runs_on_a_helper_thread():
    # What a Jupyter cell is: plain code called while the kernel's loop runs.
    async def cell():
        caller = threading.current_thread()
        value, thread = run_sync(_where("x"))
        with pytest.raises(KeyError, match="inside"):
            run_sync(_fails())
        return value, thread is not caller
    assert asyncio.run(cell()) == ("x", True)


def test_every_sync_entry_point_uses_it():
    # One home: the harness, the workload planner and notebook 8's sequential runs.
    import inspect

    from workshop.bench import run, workloads
    from workshop.engine_lab import prefix_caching
    for fn in (run.run_benchmark, workloads.plan, prefix_caching.sequential_run):
        src = inspect.getsource(fn)
        assert "run_sync(" in src and "asyncio.run(" not in src, fn.__qualname__
