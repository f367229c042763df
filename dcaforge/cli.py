"""The command line's entry point (``dcaforge``, ``python -m dcaforge.cli``).

:func:`main` puts the signal handlers in place before anything heavy is imported (the typer app,
rich and the library behind them: a second or more on a loaded machine), so Ctrl-C or SIGTERM at any moment, even
while Python is still importing, ends the run with exit 130 and a message, never a traceback. The
app itself (its options and commands) is :mod:`dcaforge.commands.app`; ``dcaforge.cli.app`` names it.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

#: The exit code of an interrupted run (dcaforge.errors.EXIT_INTERRUPTED, without importing it first).
_INTERRUPTED = 130


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same cleanup as Ctrl-C: the room is left at its last completed step


def _say_interrupted() -> None:
    sys.stderr.write("interrupted: stopped outside any step that writes (nothing was left half-written)\n"
                     "  next: run the same command again\n")


def main() -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    told = None
    try:
        from dcaforge.commands import common
        from dcaforge.commands.app import app

        told = common.interrupt_told
        common.run_from(sys.argv[1:])
        app(prog_name="dcaforge")  # the name completion keys on (_DCAFORGE_COMPLETE), however it was started
    except KeyboardInterrupt:
        if told is None or not told():
            _say_interrupted()
        sys.exit(_INTERRUPTED)
    except SystemExit as exc:
        # typer ends a KeyboardInterrupt it caught itself (outside a command's work) with exit 130, silently
        if exc.code == _INTERRUPTED and (told is None or not told()):
            _say_interrupted()
        raise


def __getattr__(name: str) -> Any:
    if name == "app":  # `from dcaforge.cli import app`: the typer app, imported when first asked for
        from dcaforge.commands.app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
