"""The package version: the one place it is written (pyproject reads it too)."""

__version__ = "0.1.0"
