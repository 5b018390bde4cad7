"""workshop.session.start_many without servers: each start gets its own environment, and a
start that fails stops the ones that succeeded (a fleet is whole or not at all)."""

from __future__ import annotations

import threading

import pytest

import workshop.session as ws


class FakeSession:
    def __init__(self, name: str) -> None:
        self.name, self.stopped = name, False

    def stop(self) -> None:
        self.stopped = True


def test_each_start_gets_its_own_env(monkeypatch):
    seen = {}

    def start(engine, args, verbose, env):
        seen[args[0]] = env
        return FakeSession(args[0])

    monkeypatch.setattr(ws, "start", start)
    out = ws.start_many("vllm", {"a": ["a"], "b": ["b"], "c": ["c"]},
                        envs={"a": {"X": "0"}, "b": {"X": "1"}})
    assert seen == {"a": {"X": "0"}, "b": {"X": "1"}, "c": None}
    assert [s.name for s in out.values()] == ["a", "b", "c"]


def test_a_failed_start_stops_the_others(monkeypatch):
    made = []
    lock = threading.Lock()

    def start(engine, args, verbose, env):
        if args[0] == "bad":
            raise RuntimeError("did not start")
        with lock:
            made.append(FakeSession(args[0]))
            return made[-1]

    monkeypatch.setattr(ws, "start", start)
    with pytest.raises(RuntimeError, match="did not start"):
        ws.start_many("mini", {"a": ["a"], "bad": ["bad"], "c": ["c"]})
    assert len(made) == 2 and all(s.stopped for s in made)


def test_the_env_reaches_the_server_on_top_of_this_process(monkeypatch):
    from reference_server import launch
    got = {}

    def fake_launch(args, **kw):
        got.update(kw)
        raise RuntimeError("stop here")

    monkeypatch.setenv("KEPT", "yes")
    monkeypatch.setattr(launch, "launch", fake_launch)
    with pytest.raises(RuntimeError, match="stop here"):
        ws.start("mini", [], verbose=False, env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    assert got["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "1" and got["env"]["KEPT"] == "yes"
    with pytest.raises(RuntimeError, match="stop here"):
        ws.start("mini", [], verbose=False)
    assert got["env"] is None                     # no extras: this process's environment
