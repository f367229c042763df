"""``dcaforge calibrate``'s report: the dev sweep, the pick, the held-out check beside YaRN and the copy written
(report.json)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dcaforge.gate import longctx
from dcaforge.gate.calibrate_gguf import CopyResult, GgufInfo
from dcaforge.gate.calibrate_plan import CEILING_MIN, Plan, ceiling_holds


@dataclass
class Report:
    model: Path
    out: Path
    work: Path
    info: GgufInfo
    plan: Plan
    dev: dict[str, dict[int, longctx.Score]]        # candidate -> dev length -> score
    ppl: dict[str, float | None]                    # candidate -> dev perplexity
    choice: longctx.Choice
    chunk: int
    local: int
    heldout: dict[str, dict[int, longctx.Score]]    # pick, yarn -> held-out length -> score
    copy: CopyResult
    notes: list[str] = field(default_factory=list)
    plot_path: Path | None = None
    json_path: Path | None = None
    seconds: float = 0.0
    ceilings: dict[str, longctx.Score] = field(default_factory=dict)   # "dev", "heldout" -> plain inside L
    far: dict[str, longctx.Score] = field(default_factory=dict)        # finalist -> score at plan.far_dev
    far_heldout: longctx.Score | None = None                           # the pick at plan.far_heldout

    def ceiling_line(self, which: str) -> str | None:
        """A failed ceiling in words (None when it holds or was not measured)."""
        s = self.ceilings.get(which)
        if s is None or ceiling_holds(s):
            return None
        return (f"plain attention inside L ({self.plan.inside} tokens) found the key {s} on the {which} text, below "
                f"the ceiling of {CEILING_MIN:.0%}: that text cannot rank methods past L for this model")

    @staticmethod
    def total(cells: dict[int, longctx.Score]) -> longctx.Score:
        return longctx.Score(sum(s.k for s in cells.values()), sum(s.n for s in cells.values()))

    @property
    def verdict(self) -> str:
        """The held-out check in a line: the pick's score beside YaRN's, or why the held-out text cannot judge."""
        failed = self.ceiling_line("heldout")
        if failed:
            return f"held-out: cannot judge: {failed}"
        p, y = self.total(self.heldout[self.choice.pick]), self.total(self.heldout["yarn"])
        if p.k > y.k:
            word = "above"
        elif p.k == y.k:
            word = "level with"
        else:
            word = "BELOW"
        far = f"; at {self.plan.far_heldout} tokens {self.far_heldout}" if self.far_heldout is not None else ""
        return f"held-out: {self.choice.pick} {p} {word} YaRN {y}{far}"

    def to_dict(self) -> dict[str, Any]:
        def sc(s: longctx.Score) -> dict[str, Any]:
            lo, hi = s.interval
            return {"k": s.k, "n": s.n, "wilson95": [round(lo, 4), round(hi, 4)]}

        def cells(d: dict[str, dict[int, longctx.Score]]) -> dict[str, Any]:
            return {m: {"lengths": {str(n): sc(s) for n, s in by.items()}, "total": sc(self.total(by))} for m, by in d.items()}

        info = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.info).items()}
        pl = {**asdict(self.plan), "total_trials": self.plan.total_trials}
        return {"model": str(self.model), "out": str(self.out), "work": str(self.work), "gguf": info, "plan": pl,
                "dev": cells(self.dev), "dev_perplexity": self.ppl,
                "choice": {"pick": self.choice.pick, "why": self.choice.why, "near": list(self.choice.near),
                           "slack": self.choice.slack, "chunk_size": self.chunk, "local_size": self.local,
                           "temperature": self.copy.temperature},
                "heldout": cells(self.heldout), "verdict": self.verdict,
                "far": ({"dev_length": self.plan.far_dev, "heldout_length": self.plan.far_heldout,
                         "dev": {m: sc(s) for m, s in self.far.items()},
                         "heldout": sc(self.far_heldout) if self.far_heldout is not None else None}
                        if self.plan.far_dev else None),
                "ceilings": {k: {**sc(v), "holds": ceiling_holds(v)} for k, v in self.ceilings.items()},
                "copy": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.copy).items()},
                "notes": self.notes, "plot": str(self.plot_path) if self.plot_path else None,
                "seconds": round(self.seconds, 1)}
