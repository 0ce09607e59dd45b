"""The mechanisms behind the probe language; every engine implements the Engine protocol."""

from probescope.engines.base import Availability, Engine, EngineStats, Target

__all__ = ["Availability", "Engine", "EngineStats", "Target"]
