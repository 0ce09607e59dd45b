"""The one exception hierarchy: every error probescope raises on purpose derives from it."""

from __future__ import annotations


class ProbescopeError(Exception):
    """A user-facing error: one line of message, an optional hint, no traceback at the CLI."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def render(self) -> str:
        """The full text the CLI prints: message, then the hint on its own line."""
        text = f"error: {self.message}"
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text


class SpecError(ProbescopeError):
    """A probe spec that cannot be parsed or is not legal for its probe type.

    `column` is the 0-based index into `spec` of the offending character.
    """

    def __init__(
        self,
        message: str,
        *,
        spec: str = "",
        column: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.spec = spec
        self.column = column

    def __str__(self) -> str:
        if self.column is None:
            return self.message
        return f"{self.message} (column {self.column + 1})"

    def render(self) -> str:
        lines = [f"error: {self.message}"]
        if self.spec:
            lines.append("  " + _printable(self.spec))
            if self.column is not None:
                lines.append("  " + " " * len(_printable(self.spec[: self.column])) + "^")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


class SpecErrors(SpecError):
    """Several spec problems collected before failing; renders each of them."""

    def __init__(self, errors: list[SpecError]) -> None:
        first = errors[0]
        super().__init__(first.message, spec=first.spec, column=first.column, hint=first.hint)
        self.errors = errors

    def render(self) -> str:
        return "\n".join(e.render() for e in self.errors)


class ProcessError(ProbescopeError):
    """A process that cannot be found or read in /proc (it exited, or belongs to another user)."""


class SymbolError(ProbescopeError):
    """A target, library or symbol that cannot be found or turned into a file offset."""


class TracefsError(ProbescopeError):
    """tracefs refused an operation; carries the kernel's error_log text when there is one."""

    def __init__(
        self,
        message: str,
        *,
        hint: str | None = None,
        command: str | None = None,
        column: int | None = None,
        path: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.command = command
        self.column = column
        self.path = path

    def render(self) -> str:
        lines = [f"error: {self.message}"]
        if self.command is not None:
            lines.append("  " + _printable(self.command))
            if self.column is not None:
                lines.append("  " + " " * len(_printable(self.command[: self.column])) + "^")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)


class RingBufferFormatError(ProbescopeError):
    """A ring-buffer page, record or format file that does not follow the kernel's layout."""


class RecordingError(ProbescopeError):
    """A recording (trace.dat) that cannot be read or written: not one, truncated, a version or
    compression this reader does not know."""


class PtraceError(ProbescopeError):
    """A ptrace operation on a tracee failed."""


class BpfError(ProbescopeError):
    """The bpf() or perf_event_open() system call refused an operation; `errno` says why."""

    def __init__(self, message: str, *, hint: str | None = None, errno: int = 0) -> None:
        super().__init__(message, hint=hint)
        self.errno = errno


class VerifierError(BpfError):
    """The kernel's verifier rejected a program; `log` holds what it said."""

    def __init__(
        self, message: str, *, hint: str | None = None, errno: int = 0, log: str = ""
    ) -> None:
        super().__init__(message, hint=hint, errno=errno)
        self.log = log


class EngineUnavailable(ProbescopeError):
    """An engine cannot run on this machine; the message says why."""


def _printable(text: str) -> str:
    return text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
