"""The typer app: the global options (``-v``, ``--version``) and the commands, one line each; what
each command does and prints is in its own module here. :mod:`dcaforge.cli` runs it."""

from __future__ import annotations

from typing import Annotated

import typer

from .. import __version__
from . import apply, build, gate, patch, render, status
from .common import out, setup_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Keep a patch series and a templated feature on top of llama.cpp, in a clean room.")


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
