"""Model adapters: stage transforms and the model-specific steps around graphs.

Importing this package loads nothing heavy; each adapter module imports its own dependencies.
"""
