"""Entry point of the frozen application (PyInstaller): the studio, its self-test and workers.

Workers of the bundled interpreter re-launch this same executable with ``--worker NAME``
(see ``runtime.host.launch``); ``app.main`` dispatches them before importing Qt.
"""

if __name__ == "__main__":
    import multiprocessing

    # First of all: a process that multiprocessing spawns from the frozen executable must
    # run its target here and never reach the studio.
    multiprocessing.freeze_support()

    from app.main import main

    raise SystemExit(main())
