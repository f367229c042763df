"""The command line: the typer app, its global options (``-v``, ``--version``) and its commands,
one line each; what each command does and prints is in :mod:`dcaforge.commands`."""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Any

import typer

from . import __version__
from .commands import apply, build, calibrate, gate, patch, render, status
from .commands.common import out, run_from, setup_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Keep a patch series and a templated feature on top of llama.cpp, in a clean room.")


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # the same cleanup as Ctrl-C: the room is left at its last completed step


def _version(value: bool) -> None:
    if value:
        out.print(f"dcaforge {__version__}")
        raise typer.Exit(0)


@app.callback()
def _main(verbose: Annotated[bool, typer.Option("-v", "--verbose", help="log every command run")] = False,
          version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                                callback=_version)] = False) -> None:
    setup_logging(verbose)


app.command()(apply.apply)
app.command()(render.render)
app.command()(render.drift)
app.command()(patch.capture)
app.command()(patch.templatize)
app.command()(patch.verify)
app.command()(status.status)
app.command()(build.build)
app.command()(gate.gate)
app.command()(calibrate.calibrate)


def main() -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    run_from(sys.argv[1:])
    app()


if __name__ == "__main__":
    main()
