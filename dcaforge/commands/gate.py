"""``dcaforge gate``: the config's acceptance gates run on the builds, as tables or JSON."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from dcaforge.commands.common import ConfigOpt, JsonOpt, call, err, load, out, print_json
from dcaforge.gate.gate import GateHooks, points_table, run_gates


def gate(
    config: ConfigOpt = None,
    only: Annotated[list[str] | None, typer.Option("--only", metavar="NAME", help="run only this gate (repeatable)")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the acceptance gates of the config on the builds; exit 1 when one fails."""
    cfg = load(config)
    hooks = GateHooks(on_gate=lambda g: err.print(f"[bold]gate[/] {escape(g.name)} ({g.kind})", markup=True),
                      on_step=lambda s: err.print(f"  {s}", markup=False))
    rep = call(lambda: run_gates(cfg, only=only or (), hooks=hooks), interrupted="the gates were stopped; no results written")
    if as_json:
        print_json("gate", rep.to_dict())
    else:
        table = Table(title="gates")
        for col in ("gate", "kind", "result", "seconds", "details"):
            table.add_column(col)
        for r in rep.results:
            table.add_row(r.name, r.kind, Text("PASS" if r.passed else "FAIL", style="green" if r.passed else "bold red"),
                          f"{r.seconds:.0f}", r.summary)
        out.print(table)
        for r in rep.results:
            pts = points_table(r)
            if pts is not None:
                title, cols, rows = pts
                t = Table(title=title)
                for col in cols:
                    t.add_column(col, justify="right")
                for row in rows:
                    t.add_row(*row)
                out.print(t)
        out.print(f"results: {rep.json_path}")
        if rep.plot_path:
            out.print(f"plot:    {rep.plot_path}")
    if not rep.passed:
        for r in rep.results:
            for f in r.failures:   # each failing cell: gate, task, context, method, score against its threshold
                err.print(f"failed: {f['text']}", style="red")
        err.print(f"gate failed: {', '.join(r.name for r in rep.results if not r.passed)}", style="red")
        raise typer.Exit(1)
