"""Typed exceptions: one per rejection cause, carrying the numbers, and the rest by status.

They live in ortserve.status.call_errors, which the gateway decodes with too; this module
keeps the client's names for them (all of call_errors.__all__)."""

from __future__ import annotations

from ortserve.status.call_errors import *  # noqa: F403
from ortserve.status.call_errors import __all__ as __all__
