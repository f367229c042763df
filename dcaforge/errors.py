"""The one error family of dcaforge.

Every error carries what failed (``message``), where (``where``: a file, a line, a patch, a
path) and what to do next (``hint``: usually the next command to run). The CLI prints these
and exits with ``exit_code``; besides them it catches only an interrupt (exit 130) and, as a last
resort, an OS error the library did not turn into one of these (told the same way, exit 1).
"""

from __future__ import annotations

#: Exit code for every error that is not one of the two below.
EXIT_ERROR = 1
#: Exit code of a usage error (typer's own: an unknown option, a missing argument).
EXIT_USAGE = 2
#: Exit code when a patch or a template anchor does not fit the tree, or a patch does not round trip.
EXIT_MISMATCH = 3
#: Exit code when the run was interrupted (Ctrl-C, SIGTERM).
EXIT_INTERRUPTED = 130


class DcaforgeError(Exception):
    """Base of every error dcaforge reports to the user."""

    exit_code: int = EXIT_ERROR

    def __init__(
        self,
        message: str,
        *,
        where: str | None = None,
        hint: str | None = None,
        details: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint
        self.details = details

    def __str__(self) -> str:
        parts = [self.message]
        if self.where:
            parts.append(f"where: {self.where}")
        if self.details:
            parts.append(self.details.rstrip())
        if self.hint:
            parts.append(f"next: {self.hint}")
        return "\n".join(parts)


class MismatchError(DcaforgeError):
    """A patch or a template anchor does not fit the tree, or a patch does not round trip (exit code 3)."""

    exit_code = EXIT_MISMATCH


class ConfigError(DcaforgeError):
    """dcaforge.yaml or a manifest is malformed: names the key, the file and the line."""

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None,
                 details: str | None = None) -> None:
        super().__init__(message, where=where, details=details,
                         hint=hint or "fix that in the file and line named by where:, then run the command again")


class CommandError(DcaforgeError):
    """An external command (git, patch, pip, a bootstrap step) failed."""


class SafetyError(DcaforgeError):
    """dcaforge refused to do something that could lose the user's work."""


class LockedError(DcaforgeError):
    """Another dcaforge run holds the clean room."""


class ToolchainError(DcaforgeError):
    """A tool the build needs (cmake, ninja, make, cosmocc, nvcc) is missing; says how to get it."""


class BuildError(DcaforgeError):
    """The build failed: names the first compiler error and the log."""


class GateError(DcaforgeError):
    """A gate could not run (a missing build, model or tool); a gate that runs and fails is a result."""


class InterruptedRun(DcaforgeError, KeyboardInterrupt):
    """The run was interrupted (Ctrl-C, SIGTERM) and cleaned up; ``hint`` says what to run next
    (exit code 130). Still a KeyboardInterrupt for a caller that stops on those."""

    exit_code = EXIT_INTERRUPTED


class CalibrateError(DcaforgeError):
    """``dcaforge calibrate`` refused its input (not a GGUF, truncated, a model DCA cannot serve, no build, an output
    that exists) or a server it started failed; the input is never changed."""
