"""Stage backends: how the engine talks to a stage's worker, and the checks on what it reports.

Importing this package loads nothing heavy; each backend module imports its own dependencies.
"""
