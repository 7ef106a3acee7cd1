"""Small importable modules that tests name in pipeline files."""
