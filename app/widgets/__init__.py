"""The studio's widgets. They take values from :mod:`app.models` and never call the runtime."""
