"""The typer app: the global options (``-v``, ``--version``) and the commands, one line each; what
each command does and prints is in its own module here. :mod:`dcaforge.cli` runs it."""

from __future__ import annotations

from typing import Annotated

import typer

from dcaforge import __version__
from dcaforge.commands import apply, build, calibrate, gate, patch, render, status, tryout
from dcaforge.commands.common import out, setup_logging

#: plain help (``-c, --config CONFIG``, flags without a type label, at most 80 columns wide); shell
#: completion: ``dcaforge --install-completion`` (bash, zsh, fish) or ``--show-completion``
app = typer.Typer(no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
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


# each command's line in `dcaforge --help` (its docstring, in full, heads its own --help)
app.command(short_help="make or refresh the clean room: series, baseline, feature")(apply.apply)
app.command(short_help="render the feature's templates into the clean room")(render.render)
app.command(short_help="count the feature's edits that fit another llama.cpp tree")(render.drift)
app.command(short_help="write the clean room's changes as the feature's patch")(patch.capture)
app.command(short_help="write the clean room's changes back into the templates")(patch.templatize)
app.command(short_help="prove the patch round-trips (and equals a fresh render)")(patch.verify)
app.command(short_help="where the clean room stands")(status.status)
app.command(short_help="build the clean room: llama-server, llama-cli, ...")(build.build)
app.command(short_help="run the config's acceptance gates on the builds")(gate.gate)
app.command("try", short_help="serve a GGUF past its trained context with DCA, answer a prompt")(tryout.try_)
app.command(short_help="measure a model's DCA sizes, write them into a copy of its GGUF")(calibrate.calibrate)
