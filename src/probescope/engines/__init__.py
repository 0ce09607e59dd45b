"""The mechanisms behind the probe language; every engine implements the Engine protocol.

`Availability`, `Engine`, `EngineStats` and `Target` load from engines.base on first use, so
that importing one engine helper (the running kernel's grammar, say) does not import them all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probescope.engines.base import Availability, Engine, EngineStats, Target

__all__ = ["Availability", "Engine", "EngineStats", "Target"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'probescope.engines' has no attribute {name!r}")
    from probescope.engines import base

    value = getattr(base, name)
    globals()[name] = value
    return value
