"""uprobes re-implemented in user space with ptrace, for machines without root or tracefs."""

from probescope.engines.ptrace.engine import PtraceEngine
from probescope.engines.ptrace.handlers import HitContext

__all__ = ["HitContext", "PtraceEngine"]
