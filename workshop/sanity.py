"""Physical sanity gates: a measurement checked against what this machine itself measured.

Nothing runs faster than its roof, a part never costs more than the whole, a request served
from a cache is not a cold one. A notebook calls the checks that apply right after it
measures; each returns a list of ``Violation`` (empty: plausible). ``report`` renders them as
lines that begin ``implausible:`` with the likely causes, and the notebook withholds the
conclusion it would have drawn. The notebook tests fail on any such line in a notebook's
output (``tests/notebooks/test_execute.py``), so a gate that trips in CI fails the build.

Pure arithmetic on numbers handed in: the roofs come from ``roofline_measure``, the timings
from the harness.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

# Measured points are medians of a few requests on a shared machine, the roofs the best of a
# few runs; 20 % covers the run-to-run spread seen on the course's 2-core machines.
MEASUREMENT_ERROR = 0.20
MARK = "implausible:"
# What a conclusion cell shows instead of its conclusion once a gate above it has failed.
WITHHELD = ("_Withheld: a measurement above failed a sanity check. Re-run the measuring cells; "
            "if it stays, report it._")

CAUSES = {
    "cache": "a prefix-cache hit timed as a cold request",
    "busy": "another process on the machine while the roof or the point was measured",
    "few": "too few samples (quick mode)",
    "count": "a FLOP or byte count that does not match what the engine computes",
    "kernel": "a roof timed with a slower kernel than the engine's",
    "idle": "the load never reached the server, or every request failed",
    "warm-up": "the side timed first paid a fresh server's warm-up",
}


@dataclass(frozen=True)
class Violation:
    check: str                    # which law: "above the roof", "nothing completed", ...
    what: str                     # the measurement and the bound, with numbers
    causes: tuple[str, ...]       # keys of CAUSES, most likely first

    def line(self) -> str:
        likely = "; ".join(CAUSES.get(c, c) for c in self.causes)
        return f"{MARK} {self.check}: {self.what}. Likely causes: {likely}."


def within(label: str, value: float, bound: float, unit: str, check: str,
           causes: Sequence[str], error: float = MEASUREMENT_ERROR) -> list[Violation]:
    """``value`` at most ``bound`` x (1 + error): the general form of every roof check."""
    if not (math.isfinite(value) and math.isfinite(bound)) or bound <= 0:
        return []
    if value <= bound * (1 + error):
        return []
    return [Violation(check, f"{label} measured {value:,.4g} {unit}, {value / bound:.2f}x the "
                             f"bound of {bound:,.4g} {unit} (allowed: {1 + error:.2f}x)",
                      tuple(causes))]


def bandwidth_within_roof(label: str, bytes_per_s: float, bandwidth: float,
                          error: float = MEASUREMENT_ERROR) -> list[Violation]:
    """Bytes moved per second at most the measured memory bandwidth."""
    return within(label, bytes_per_s / 1e9, bandwidth / 1e9, "GB/s", "above the bandwidth",
                  ("busy", "count", "few"), error)


def part_within_whole(label: str, part_cost: float, share_of_work: float,
                      error: float = MEASUREMENT_ERROR) -> list[Violation]:
    """A part (a draft model of k of L layers) costs at most its share of the work, relative to
    the whole (both as fractions of the full model's cost), plus the error."""
    return within(label, part_cost, share_of_work, "of the whole",
                  "a part costs more than its share", ("busy", "few", "count"), error)


def cold(label: str, cached_tokens: Iterable[int | None]) -> list[Violation]:
    """Requests timed as cold report no prompt tokens served from a prefix cache."""
    hits = [c for c in cached_tokens if c]
    if not hits:
        return []
    return [Violation("a cached request timed as cold",
                      f"{label}: {len(hits)} request(s) reported {sum(hits):,} prompt tokens "
                      "served from the prefix cache", ("cache",))]


def hit_within_floor(label: str, ratio: float, skipped: float,
                     error: float = MEASUREMENT_ERROR) -> list[Violation]:
    """A prefix-cache hit's TTFT over the same request's cold TTFT is at least 1 - ``skipped``
    (the share of the prompt the hit skips): the tokens it computes still attend to the whole
    prompt, and the rest of the request costs what it cost cold."""
    floor = 1 - skipped
    if not math.isfinite(ratio) or ratio * (1 + error) >= floor:
        return []
    return [Violation("a cache hit cheaper than the work it skips",
                      f"{label}: TTFT with / without the cache {ratio:.2f}, below 1 - "
                      f"{skipped:.2f} = {floor:.2f}, what skipping only the cached tokens allows",
                      ("warm-up", "busy", "few"))]


def completed_some(label: str, completed: int, sent: int) -> list[Violation]:
    """A conclusion about waiting, admission or speed needs at least one finished request."""
    if sent <= 0 or completed > 0:
        return []
    return [Violation("nothing completed", f"{label}: 0 of {sent} requests completed", ("idle",))]


def grows_with(label: str, xs: Sequence[float], ys: Sequence[float],
               error: float = MEASUREMENT_ERROR) -> list[Violation]:
    """``ys`` do not fall as ``xs`` grow, beyond the error: a longer prompt's first token never
    comes markedly sooner than a shorter one's."""
    pts = sorted((x, y) for x, y in zip(xs, ys) if math.isfinite(y))
    out = []
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x1 > x0 and y1 < y0 * (1 - error):
            out.append(Violation("shorter for more work",
                                 f"{label}: {y1:,.4g} at {x1:,.4g} against {y0:,.4g} at {x0:,.4g}",
                                 ("cache", "busy", "few")))
    return out


def nonzero(label: str, values: Iterable[float]) -> list[Violation]:
    """A gauge sampled under load is not zero throughout."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if any(v != 0 for v in vals):
        return []
    return [Violation("a gauge that never moved", f"{label}: {len(vals)} samples under load, all 0",
                      ("idle", "few"))]


def report(violations: Sequence[Violation]) -> str:
    """The ``implausible:`` lines, one per violation, as markdown ("" when there are none)."""
    return "\n\n".join(f"**{v.line()}**" for v in violations)


__all__ = ["MEASUREMENT_ERROR", "MARK", "WITHHELD", "CAUSES", "Violation", "within",
           "bandwidth_within_roof", "part_within_whole", "cold", "hit_within_floor",
           "completed_some", "grows_with", "nonzero", "report"]
