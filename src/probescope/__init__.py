"""probescope: Linux dynamic and static tracing — one probe language, several engines."""

__version__ = "0.1.0"
