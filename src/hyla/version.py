"""hyla's version, importable without importing the package's models (pyproject.toml holds the same number)."""

__version__ = "0.1.0"
