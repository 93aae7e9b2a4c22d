"""opgen: TOML spec -> differentiable TileLang operator package."""

__version__ = "0.1.0"
