"""`pip install dcaforge` alone runs the gates: the wheel built from this checkout, installed into a
fresh virtual environment (its dependencies from PyPI, no repository on sys.path), runs `dcaforge
gate` from a folder outside the repository on the e2e clean room's build: a tiny recipe model
(dcaforge.gate.gatetools.tiny), the logits dumper compiled from the wheel's own dca_logits.cpp, and the
ruler gate through the room's llama-server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from e2e_helpers import CONFIG, REPO, WORKSPACE, dcaforge, run


def test_installed_wheel_runs_the_gates_outside_the_repo(cleanroom: Path, tmp_path: Path) -> None:
    p = dcaforge("build", "--targets", "llama llama-server")
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    # the wheel is built from a copy of the checkout's files (setuptools writes build/ and *.egg-info next to the sources)
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in files.decode().split("\0"):
        if rel and (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    wheels = tmp_path / "wheels"
    r = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)], cwd=tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    (whl,) = wheels.glob("dcaforge-*.whl")
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)]).returncode == 0
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    r = run([str(venv / "bin" / "pip"), "install", "-q", str(whl)], env=env, timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]

    # the e2e room's config, its gates replaced, read from a folder outside the repository
    data = yaml.safe_load(CONFIG.read_text())
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    data["root"] = str(outside)
    data["gates"] = [
        {"name": "noop", "kind": "noop-below-chunk", "recipe": "tiny:gemma3", "chunk": 192, "local": 32, "flash_attn": [True]},
        {"name": "ruler-tiny", "kind": "ruler", "recipe": "tiny:qwen2", "tasks": ["passkey"], "scales": [4],
         "methods": ["plain", "dca"], "samples": 1, "chunk": 192, "local": 32},
    ]
    cfg = outside / "dcaforge.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    probe = subprocess.run([str(venv / "bin" / "python"), "-c", "import dcaforge, dcaforge.gate.gatetools.build_logits as b; "
                            "print(dcaforge.__file__); print(b.SRC)"], cwd=outside, env=env, capture_output=True, text=True, check=False)
    assert probe.returncode == 0, probe.stderr
    installed, src = probe.stdout.split()
    assert str(venv) in installed and str(REPO) not in installed and Path(src).is_file() and str(venv) in src

    r = run([str(venv / "bin" / "dcaforge"), "gate", "-c", str(cfg), "--json"], cwd=outside, env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout)
    gates = {g["name"]: g for g in res["gates"]}
    assert gates["noop"]["passed"] and gates["noop"]["metrics"]["fa_on"]["max_rel_err"] <= 1e-3
    ruler_g = gates["ruler-tiny"]
    assert ruler_g["passed"] and ruler_g["metrics"]["contexts"] == [1024]
    assert [(pt["task"], pt["ctx"]) for pt in ruler_g["points"]] == [("passkey", 1024)]
    assert all(0.0 <= ruler_g["points"][0][m] <= 1.0 for m in ("plain", "dca"))
    assert (WORKSPACE / "upstream-gates" / "models" / "tiny-gemma3.gguf").is_file()
    # without the plots extra the figure is left out, and the gate says so
    assert res["plot"] is None and "pip install 'dcaforge[plots]'" in r.stderr
