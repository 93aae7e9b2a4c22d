"""opgen: TOML spec -> differentiable TileLang operator package."""

__version__ = "0.1.0"
# The TileLang the templates are written for and the compile check runs (pyproject.toml pins it):
# named in every generated file's header and checked by each package at import.
TILELANG_VERSION = "0.1.15"
