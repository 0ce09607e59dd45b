"""probescope: Linux dynamic and static tracing — one probe language, several engines.

The public API: `Session` (specs in, events out), the `Event` it yields, `open_sink` for the
kernel-identical text and JSON lines outputs, `EngineOptions`, and `ProbescopeError`, the root of
every error probescope raises on purpose. They load on first use, so that `import probescope`
(and the command line's start-up) stays cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

# No import runs here at all (not even `typing`): `python -m probescope` executes this before
# the command line can install its Ctrl-C handling, so it must take no time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from probescope.engines.base import EngineOptions
    from probescope.errors import ProbescopeError
    from probescope.events import Event, EventBatch, EventType
    from probescope.session import Session, Summary
    from probescope.sinks.base import open_sink

_EXPORTS = {
    "Session": "probescope.session",
    "Summary": "probescope.session",
    "Event": "probescope.events",
    "EventBatch": "probescope.events",
    "EventType": "probescope.events",
    "EngineOptions": "probescope.engines.base",
    "ProbescopeError": "probescope.errors",
    "open_sink": "probescope.sinks.base",
}

__all__ = [
    "EngineOptions",
    "Event",
    "EventBatch",
    "EventType",
    "ProbescopeError",
    "Session",
    "Summary",
    "__version__",
    "open_sink",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'probescope' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
