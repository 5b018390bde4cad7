"""Where the kernel has no parent-death signal (macOS), a server polls its launcher instead."""

import asyncio
import os
import subprocess
import sys

from reference_server import launch


def test_without_the_kernels_signal_a_child_is_told_its_launcher(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "_prctl", None)
    log = tmp_path / "child.log"
    child = launch.start([sys.executable, "-c",
                          f"import os; print(os.environ.get({launch.PARENT_PID_ENV!r}))"],
                         log_path=log)
    child.proc.wait(30)
    assert log.read_text().strip() == str(os.getpid())


def test_on_linux_no_variable_is_set(tmp_path):
    if launch._prctl is None:
        return                      # not Linux: the test above covers it
    log = tmp_path / "child.log"
    child = launch.start([sys.executable, "-c",
                          f"import os; print(os.environ.get({launch.PARENT_PID_ENV!r}))"],
                         log_path=log)
    child.proc.wait(30)
    assert log.read_text().strip() == "None"


def test_a_server_hears_when_its_launcher_is_gone(monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    monkeypatch.setenv(launch.PARENT_PID_ENV, str(gone.pid))
    heard = []

    async def main():
        task = launch.watch_launcher(heard.append)
        await asyncio.wait_for(task, 5)

    asyncio.run(main())
    assert heard == [gone.pid] and launch.PARENT_PID_ENV not in os.environ


def test_a_server_started_by_hand_watches_nothing(monkeypatch):
    monkeypatch.delenv(launch.PARENT_PID_ENV, raising=False)
    assert launch.watch_launcher(lambda pid: None) is None
