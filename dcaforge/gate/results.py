"""The gates' results: one gate's (:class:`GateResult`), the run's (:class:`GateReport`, written as results.json),
and the hooks that tell the CLI what runs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dcaforge.configsections import GateConfig


@dataclass
class GateResult:
    name: str
    kind: str
    passed: bool
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)
    points: list[dict[str, Any]] = field(default_factory=list)  # extension: one row per context
    seconds: float = 0.0
    #: the cells that failed a threshold: gate, task, ctx, method, score, threshold, rule and a line that says it
    failures: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class GateReport:
    results: list[GateResult]
    out_dir: Path
    json_path: Path
    plot_path: Path | None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "gates": [asdict(r) for r in self.results],
                "plot": str(self.plot_path) if self.plot_path else None}


@dataclass
class GateHooks:
    on_gate: Callable[[GateConfig], None] | None = None
    on_step: Callable[[str], None] | None = None


def failure(gate: str, task: str, ctx: int | None, method: str, score: float | None, threshold: float | None, rule: str,
            text: str) -> dict[str, Any]:
    """A cell that failed a threshold, as :attr:`GateResult.failures` lists it (``text`` prefixed with the gate)."""
    return {"gate": gate, "task": task, "ctx": ctx, "method": method, "score": score, "threshold": threshold,
            "rule": rule, "text": f"{gate}: {text}"}
