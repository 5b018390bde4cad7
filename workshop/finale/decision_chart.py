"""The decision chart drawn, and the report written, from showdown folders: a grid naming the
winner and margin per workload and constraint above a bar panel of each engine's throughput at
its knee. What is compared, and by which rule, is ``workshop.finale.decision``'s (its
docstring); this module only draws its verdicts and rows, and writes them next to the figure
(``write_report``, behind ``benchmarks/showdown.py``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Sequence

from workshop.bench.plots import engine_colors
from workshop.finale.decision import (
    CONSTRAINTS,
    TIE_WITHIN,
    WRONG_ANSWERS,
    Results,
    Verdict,
    common_load,
    decisions,
    display_rows,
    feature_rows,
    figure_rows,
    knee_table,
    load,
    row_of,
    setup_label,
    setup_rows,
    slo_of,
    verdict_rows,
)


def _light(color: Any, amount: float = 0.55) -> tuple[float, float, float]:
    r, g, b = color[:3]
    return (r + (1 - r) * amount, g + (1 - g) * amount, b + (1 - b) * amount)


def _why_nobody(v: Verdict) -> str:
    """A grid cell's text when no engine qualifies."""
    if not v.excluded:
        return "no data"
    reasons = list(v.excluded.values())
    if all(r.startswith("knee: not judged") for r in reasons):
        return "not enough requests per\npoint to judge a knee"
    if all(r.startswith("knee: none") for r in reasons):
        return "no engine met the\nobjectives at any load"
    if all(r.startswith("run ") for r in reasons):
        return "every run failed"
    if v.constraint == "goodput":
        return "no request met\nthe objectives"
    return "nobody qualifies"


def _margin(margin: float, bound: str) -> str:
    """A margin and its bound in a grid cell: "×2.1", "≥ ×2.1", "≤ ×2.1" (a margin between two
    lower bounds, ``bound == "unknown"``, gets its own line from the caller)."""
    sign = {"at least": "≥ ", "at most": "≤ "}.get(bound, "")
    return f"{sign}×{'∞' if math.isinf(margin) else f'{margin:.2g}'}"


def _wrap(text: str, width: int = 42) -> str:
    import textwrap
    return "\n".join(textwrap.wrap(text, width)) if text else "configuration not recorded"


def plot_decision(verdicts: Sequence[Verdict], rows: Sequence[dict[str, Any]], title: str,
                  engines: Sequence[str] | None = None):
    """A grid (workload x constraint) naming each winner and its margin, coloured by engine,
    above a bar panel of each engine's throughput at its knee per workload."""
    from matplotlib.patches import Patch, Rectangle

    from workshop.plots import figure

    workloads = (list(dict.fromkeys(v.workload for v in verdicts))
                 or list(dict.fromkeys(r["workload"] for r in rows)))
    constraints = list(dict.fromkeys(v.constraint for v in verdicts)) or list(CONSTRAINTS)
    engines = list(engines or dict.fromkeys(r["engine"] for r in rows))
    if not rows:
        fig, ax = figure(title, "", "", size=(8.0, 2.2))
        ax.axis("off")
        ax.text(0.5, 0.5, "No showdown data to chart.\nRun notebook 10 or `python "
                          "benchmarks/showdown.py` first.",
                ha="center", va="center", fontsize=11)
        return fig
    colors = engine_colors(engines)
    fig, _ = figure(title, "", "", size=(11.5, 3.2 + 0.85 * max(len(workloads), 1) + 3.0))
    fig.clear()
    fig.suptitle(title, fontsize=11)
    grid_ax, bar_ax = fig.subplots(2, 1, height_ratios=[0.85 * max(len(workloads), 1) + 0.8, 3.0])

    # -- the grid
    by = {(v.workload, v.constraint): v for v in verdicts}
    grid_ax.set_xlim(0, len(constraints))
    grid_ax.set_ylim(len(workloads), 0)
    for i, w in enumerate(workloads):
        for j, c in enumerate(constraints):
            v = by.get((w, c))
            face, text, hatch, edge = (0.96, 0.96, 0.96), "no data", None, None
            if v is not None:
                o = v.outcome
                if o == "win":
                    face = colors.get(v.winner, (0.7, 0.7, 0.7))
                    face = _light(face, 0.35 if v.margin and v.margin >= 1.5 else 0.6)
                    text = f"{v.winner}\n{_margin(v.margin, v.bound)} vs {v.runner_up}"
                    if v.bound == "unknown":     # a bare "?" was read as a typo
                        text += "\nat the loads tried\n(both could go higher)"
                elif o == "tie":
                    face, hatch = (0.88, 0.88, 0.88), "//"
                    # three long names on one line would spill into the next cell
                    text = ("tie (<{:.0%} apart)\n".format(TIE_WITHIN)
                            + _wrap(" ≈ ".join(v.tied[:3]) + (" …" if len(v.tied) > 3 else ""), 24))
                    if v.lead:
                        other, m, bound = v.lead
                        text += (f"\neach {_margin(m, bound)} vs {other}"
                                 + ("\nat the loads tried" if bound == "unknown" else ""))
                elif o == "only":
                    face = _light(colors.get(v.winner, (0.7, 0.7, 0.7)), 0.75)
                    text = f"{v.winner}\n(the only one that qualifies)"
                else:
                    text = _why_nobody(v)
                if v.ignores_objectives and o != "none":
                    # Another question than the other cells answer: drawn like the capacity
                    # outlines below (dashed, lighter) and saying so.
                    face, hatch = _light(face, 0.5), None
                    edge = colors.get(v.winner, (0.5, 0.5, 0.5)) if v.winner else (0.5, 0.5, 0.5)
                    text += "\ncapacity alone, objectives\nignored: no engine met\nthem at any load"
                if v.flags and o in ("win", "tie"):
                    text += "\n(see caveats)"
                if v.setup and o in ("win", "tie"):
                    text += "\n(set-ups differ)"
            grid_ax.add_patch(Rectangle((j + 0.02, i + 0.04), 0.96, 0.92, facecolor=face,
                                        edgecolor=edge or "white", linestyle="--" if edge else "-",
                                        hatch=hatch, linewidth=1.5 if edge else 1.0))
            grid_ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=8.5)
    grid_ax.set_xticks([j + 0.5 for j in range(len(constraints))])
    grid_ax.set_xticklabels([f"{CONSTRAINTS[c][0]}\n"
                             f"({'higher' if CONSTRAINTS[c][3] == 'higher' else 'lower'} is better)"
                             for c in constraints], fontsize=8.5)
    grid_ax.xaxis.tick_top()
    grid_ax.set_yticks([i + 0.5 for i in range(len(workloads))])
    common = {w: common_load(rows, w) for w in workloads}
    grid_ax.set_yticklabels([w + (f"\ncommon load {common[w]:.2g} req/s" if common[w] else "")
                             for w in workloads],
                            fontsize=8.5)
    grid_ax.tick_params(length=0)
    for s in grid_ax.spines.values():
        s.set_visible(False)
    grid_ax.grid(False)
    grid_ax.set_title("winner and margin (best / runner-up) on this data; latency and KV at each "
                      "workload's common load", fontsize=9, pad=28)

    # -- the bars: filled at the knee; an outline at the best throughput of any load tried
    width = 0.8 / max(len(engines), 1)
    bar_ax.set_title("output tok/s: filled at each engine's knee (hatched: the knee is the highest "
                     "load tried, a lower bound);\ndashed outline: capacity, the most at any load "
                     "tried or in the throughput probe, objectives ignored", fontsize=9)
    ymax = max([r["output_tps"] or 0 for r in rows] + [r.get("capacity_tps") or 0 for r in rows]
               + [1e-9])
    for k, e in enumerate(engines):
        for i, w in enumerate(workloads):
            r = row_of(rows, w, e)
            x = i + (k - (len(engines) - 1) / 2) * width
            if r is None:
                continue
            if r.get("capacity_tps"):
                bar_ax.bar(x, r["capacity_tps"], width * 0.92, facecolor="none",
                           edgecolor=colors[e],
                           linestyle="--", linewidth=1.0)
            if r["output_tps"] is None:
                why = (("not judged" if r["not_judged"] else "no knee")
                       if r["status"].startswith("ok") else
                       WRONG_ANSWERS if r["status"].startswith(WRONG_ANSWERS) else
                       "not run" if r["status"].startswith("not run") else "run failed")
                bar_ax.text(x, ymax * 0.03, why, rotation=90, ha="center", va="bottom", fontsize=8,
                            color=colors[e])
                continue
            bar_ax.bar(x, r["output_tps"], width * 0.92, color=colors[e],
                       hatch="///" if r["lower_bound"] else None, edgecolor="white")
    bar_ax.set_xticks(range(len(workloads)))
    bar_ax.set_xticklabels(workloads)
    bar_ax.set_xlim(-0.5, len(workloads) - 0.5)
    bar_ax.set_ylabel("output tok/s")
    bar_ax.set_ylim(0, ymax * 1.15)
    setups = {r["engine"]: r.get("setup") or {} for r in rows}
    # What ran, beside the numbers: each engine's effective configuration under its name.
    bar_ax.legend(handles=[Patch(color=colors[e],
                                 label=f"{e}\n{_wrap(setup_label(setups.get(e, {})))}")
                           for e in engines], fontsize=7.5, loc="upper left",
                           bbox_to_anchor=(1.0, 1.0),
                  labelspacing=0.9)
    return fig


# ---------------------------------------------------------------------------------------------
# The report behind ``benchmarks/showdown.py``
# ---------------------------------------------------------------------------------------------

def write_report(roots: Sequence[str | os.PathLike], out: str | os.PathLike) -> int:
    """Draw ``decision.png`` and write ``decision.md`` (tables, verdicts, sources) into ``out``."""
    from workshop.ui import markdown_table
    results = load(*roots)
    if not results.runs:
        print(f"no runs in {', '.join(map(str, roots))}")
        return 1
    slo = slo_of(**results.slo)
    rows = knee_table(results, slo)
    verdicts = decisions(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fig = plot_decision(verdicts, rows, title_for(results))
    fig.savefig(out / "decision.png", dpi=120, bbox_inches="tight")
    lines = ["# Decision chart", "", "Measured here:", ""]
    lines += [f"- {r.describe()}" for r in results.roots]
    lines += [f"- WARNING: {w}" for w in results.warnings]
    lines += ["", f"Objectives of `{results.newest.path.name}`, used for every folder: "
              f"{results.newest.objectives} "
              f"(the knee: p99s; goodput: each request's first token and every gap); "
              f"ties: within {TIE_WITHIN:.0%}.", "", "## What ran, and whether it answered right",
              "",
              markdown_table(setup_rows(results)), "",
              "## At each knee", "", markdown_table(display_rows(rows)),
              "", "## Winners", "", markdown_table(verdict_rows(verdicts)), "",
              "## Not measured here (cited)", "", markdown_table(feature_rows()), "",
              markdown_table(figure_rows()), ""]
    (out / "decision.md").write_text("\n".join(lines))
    print(f"decision chart: {out / 'decision.png'}, {out / 'decision.md'}")
    return 0


def title_for(results: Results) -> str:
    if not results.roots:
        return "Decision chart: no showdown folder"
    newest = results.newest
    more = f" (+{len(results.roots) - 1} older folder(s))" if len(results.roots) > 1 else ""
    return (f"Decision chart: {newest.manifest.get('model', '?')}, {newest.mode} run on "
            f"{newest.machine}, {newest.created[:10]}{more}")
