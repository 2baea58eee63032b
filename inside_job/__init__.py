"""Klique's runner: sets up and runs one task inside its job (stdlib only, Python 3.8+)."""

__version__ = "0.1.0"
