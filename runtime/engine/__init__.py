"""The engine: stage runtime, orchestrator and the events they publish."""
