"""probescope: Linux dynamic and static tracing from Python — one probe language, several engines."""

__version__ = "0.1.0"
