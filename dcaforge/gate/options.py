"""A gate's options (the config's values over :data:`DEFAULTS`) and what the extension and ruler gates share: the
methods compared (plain rope, YaRN, DCA), their llama.cpp flags, the model's trained length."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcaforge.configsections import GateConfig
from dcaforge.errors import GateError
from dcaforge.gate.ggufmeta import gguf_metadata

DEFAULTS: dict[str, dict[str, Any]] = {
    "off-identity": {"n_tokens": 400, "flash_attn": [True, False], "threads": 2},
    "noop-below-chunk": {"chunk": 192, "local": 32, "tolerance": 1e-3, "flash_attn": [True, False], "threads": 2},
    "extension": {"chunk": 0, "local": 0, "dca_args": [], "extra_args": [], "ppl_ratio_max": 1.15,
                  "passkey_trials": 3, "threads": 2, "methods": ["plain", "dca"], "yarn_factor": 0.0},
    "ruler": {"tasks": ["vt", "niah_multikey", "niah_multivalue"], "scales": [1, 4, 8], "methods": ["plain", "yarn", "dca"],
              "samples": 4, "seed": 42, "vt_probe": True, "chunk": 0, "local": 0, "dca_args": [], "extra_args": [], "yarn_factor": 0.0,
              "n_predict": 0, "fewshot": True, "chat": False, "send": "tokens", "threads": 2,
              "load_timeout": 600.0, "request_timeout": 3600.0},
}


def opt(g: GateConfig, key: str) -> Any:
    return g.options.get(key, DEFAULTS[g.kind].get(key))



METHODS = ("plain", "yarn", "dca")
METHOD_LABEL = {"plain": "plain rope", "yarn": "YaRN", "dca": "DCA"}


def gate_methods(g: GateConfig) -> list[str]:
    methods = [str(m) for m in opt(g, "methods")]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods or len(set(methods)) != len(methods):
        raise GateError(f"gate {g.name!r}: 'methods:' must list some of {', '.join(METHODS)} once each, got {methods}",
                        where=g.where)
    return methods


def model_label(g: GateConfig) -> str:
    return g.model.name if g.model is not None else str(g.recipe)


def method_flags(method: str, ctx: int, trained: int, chunk: int, local: int, dca_args: Sequence[str] = (),
                 yarn_factor: float = 0.0) -> list[str]:
    """The llama.cpp options of a method at a context: plain rope (none); YaRN with the factor
    ``ctx / trained`` (or ``yarn_factor``) and the trained length as its original context; DCA with
    the chunk size and local window (0 lets llama.cpp take 1/2 and 1/8 of the trained length)."""
    if method == "plain":
        return []
    if method == "yarn":
        factor = yarn_factor if yarn_factor > 0 else max(1.0, ctx / trained)
        return ["--rope-scaling", "yarn", "--rope-scale", f"{factor:g}", "--yarn-orig-ctx", str(trained)]
    if method == "dca":
        return ["--dca", "on", "--dca-chunk-size", str(chunk), "--dca-local-size", str(local), *dca_args]
    raise ValueError(method)


def trained_length(g: GateConfig, model: Path) -> tuple[str, int]:
    """(architecture, trained length) of the gate's model: ``trained:`` when set, else its GGUF's context length."""
    return trained_of(g, gguf_metadata(model))


def trained_of(g: GateConfig, meta: dict[str, Any]) -> tuple[str, int]:
    """(architecture, trained length) from a GGUF's metadata (:func:`dcaforge.gate.ggufmeta.gguf_metadata`)."""
    arch = str(meta.get("general.architecture", ""))
    trained = int(g.options.get("trained") or meta.get(f"{arch}.context_length", 0))
    if trained <= 0:
        raise GateError(f"gate {g.name!r}: the model has no {arch}.context_length; set 'trained:'", where=g.where)
    return arch, trained
