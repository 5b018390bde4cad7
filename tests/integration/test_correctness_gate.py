"""The correctness gate over real HTTP: every engine of the fleet answers as Hugging Face float32
does on the same checkpoint (near ties aside), and a teaching engine whose weights were
deliberately broken is caught."""

from __future__ import annotations

import shutil

import pytest
from conftest import launch, stop, wait_ready

from workshop.bench.verify import verify_server

pytestmark = pytest.mark.engine

SMALL = dict(new_tokens=16, sharegpt=1)     # the short, system-prompt and one ShareGPT probe


def test_every_engine_answers_as_the_reference(server):
    import httpx

    from workshop import hardware
    from workshop.bench import showdown
    from workshop.finale import decision
    gate = verify_server(server.base_url, server.model, api_key=server.api_key, **SMALL)
    info = httpx.get(server.base_url + "/server_info", headers=server.headers, timeout=30).json()
    # what the chart and decision.md say of this engine: its gate's outcome, and "outside its
    # supported CPUs" exactly where SGLang runs without AMX (CI's AVX2 machine)
    setup = decision.setup_of(info, gate.to_dict(), showdown.machine())
    assert setup["answers"] == ("right" if gate.passed else "wrong answers")
    outside = server.engine == "sglang" and "amx_bf16" not in hardware.cpu_features()
    assert ("outside its supported CPUs" in decision.setup_label(setup)) is outside
    if not gate.passed and outside:
        # A finding on a CPU SGLang does not support (no AMX): shown, not hidden.
        pytest.skip(f"SGLang outside its supported CPUs answered wrongly: {gate.summary()}")
    assert gate.passed, gate.summary()
    repeats = [c for c in gate.checks if c.repeat]
    assert repeats and all(c.verdict != "error" for c in repeats)


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory):
    """The bundled checkpoint with one layer's MLP output negated: it loads and serves, and
    answers "The capital of France is 222.22"."""
    import torch
    from safetensors.torch import load_file, save_file

    from reference_server.models import resolve_model
    src = resolve_model("smollm2-135m").path
    dst = tmp_path_factory.mktemp("broken") / "smollm2-broken"
    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    name = "model.layers.5.mlp.down_proj.weight"
    weights[name] = torch.neg(weights[name]).contiguous()
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return str(dst)


def test_the_gate_fails_an_engine_that_answers_wrongly_and_the_showdown_does_not_rank_it(
        broken_model, tmp_path):
    import json

    from workshop.bench import showdown
    from workshop.bench.verify import Gate
    from workshop.finale import decision
    server = wait_ready(launch("mini", "--model", broken_model, "--served-model-name",
                               "smollm2-135m"))
    try:
        broken = showdown.Contender("broken", "mini", base_url=server.base_url,
                                    api_key=server.api_key)
        showdown.run_showdown(tmp_path / "sd", [broken], showdown.Plan.quick(), mode="quick",
                              command="test", progress=False, log=lambda s: None)
    finally:
        stop(server)
    # the gate the showdown ran (against the bundled checkpoint) and recorded
    manifest = json.loads((tmp_path / "sd" / "showdown.json").read_text())
    gate = Gate.from_dict(manifest["engines"]["broken"]["gate"])
    assert gate.reference.endswith("smollm2-135m") and gate.new_tokens == SMALL["new_tokens"]
    assert not gate.passed
    assert gate.counts["wrong"] >= 1 and gate.counts["error"] == 0
    worst = max(gate.failures, key=lambda c: c.gap)
    assert worst.gap > 1.0 and worst.expected != worst.got
    # not swept: shown as wrong answers, with the failing prompt, and ranked nowhere
    results = decision.load(tmp_path / "sd")
    run = results.runs[("broken", "shared-prefix")]
    assert run.sweep is None and run.status.startswith(showdown.WRONG_ANSWERS)
    assert not (tmp_path / "sd" / "broken").exists()
    rows = decision.knee_table(results)
    assert rows[0]["answers"] == "wrong answers" and "expected" in rows[0]["note"]
    assert decision.decide(rows, "shared-prefix", "throughput").excluded["broken"].startswith(
        "run " + showdown.WRONG_ANSWERS)
    assert decision.setup_rows(results)[0]["answers"].startswith("wrong answers: ")
