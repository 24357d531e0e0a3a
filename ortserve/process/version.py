"""The installed ortserve version, for every entry point's --version and for Info."""

from __future__ import annotations

from importlib import metadata


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), or a note that it is not installed."""
    try:
        return metadata.version("ortserve")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"
