"""The benchmark suite: every speed goal measured beside its baseline in the same run.

Each figure is measured by a function in its own module and returned as
:class:`benchmarks.figures.Figure` records; :mod:`benchmarks.suite` runs them all and writes
``benchmarks/results/latest.json`` and ``latest.md`` (``omni-edge bench [--quick]``,
``make bench``). The suite runs from a source checkout: it builds its graphs in a temporary
folder and uses the demo bundles under ``assets/``.
"""
