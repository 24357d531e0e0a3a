"""Moved to devtools/cluster.py (`python -m devtools.cluster`); this name re-exports it.

NOTE: kept only so that bench/run.py, owned elsewhere, keeps importing while it moves to
`devtools.cluster`; delete this file then. It works only from the repository root.
"""

from devtools.cluster import *  # noqa: F403
from devtools.cluster import __all__  # noqa: F401
