"""The version, in one place: pyproject.toml reads it, imgcopy exports it."""
__version__ = "0.2.0.dev0"
