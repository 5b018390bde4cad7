"""The showdown's switches and the decision chart (notebooks 10, 11).

``engine_switches`` (one engine feature on and off), ``decision`` (objectives and verdicts
from showdown folders), ``decision_chart`` (the chart drawn from them). The harness itself is
``workshop.bench``.
"""
