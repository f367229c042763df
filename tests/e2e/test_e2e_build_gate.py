"""`dcaforge build` and `dcaforge gate` on the real tree (the fixtures build with `dcaforge build`):
a second build is a no-op, and the configured gates pass on the tiny models (off-identity against
the baseline build, no-op below one chunk, and a smoke run of the extension gate's machinery) and
on the trained model (extension; ruler through llama-server, which the gate builds on first use:
test_e2e_ruler.py checks its results)."""

from __future__ import annotations

import json

from e2e_helpers import GateRun, dcaforge

TARGETS = "llama test-backend-ops test-dca llama-perplexity llama-passkey"


def test_build_again_rebuilds_nothing(dca_tree):
    p = dcaforge("build", "--targets", TARGETS)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "configure  up to date" in p.stdout and "(nothing to rebuild)" in p.stdout, p.stdout
    assert (dca_tree.build / "bin" / "llama-passkey").is_file()


def test_gates_pass_with_table_json_and_plot(gate_run: GateRun):
    p, res, out = gate_run.proc, gate_run.results, gate_run.out
    assert res["passed"] is True
    assert {g["name"] for g in res["gates"]} == {"off-identity", "noop-below-chunk", "extension", "ruler", "extension-smoke"}
    off = next(g for g in res["gates"] if g["kind"] == "off-identity")
    assert off["metrics"]["fa_on"]["identical"] and off["metrics"]["fa_off"]["identical"]
    ext = next(g for g in res["gates"] if g["name"] == "extension-smoke")
    assert [pt["ctx"] for pt in ext["points"]] == [256, 512, 1024]
    assert all(pt["ppl_plain"] and pt["ppl_dca"] for pt in ext["points"])
    # the trained long-context model (tests/models/longctx.md): DCA holds at 8x, plain rope does not
    trained = next(g for g in res["gates"] if g["name"] == "extension")
    pts = {pt["ctx"]: pt for pt in trained["points"]}
    assert pts[2048]["ppl_dca"] <= 1.15 * pts[256]["ppl_plain"]
    assert pts[2048]["ppl_plain"] >= 2.0 * pts[256]["ppl_plain"]
    # and below YaRN's (measured: 4.60 against 5.75, one window of the held-out text at 2048)
    assert pts[2048]["ppl_dca"] < pts[2048]["ppl_yarn"] < pts[2048]["ppl_plain"]
    assert (out / "gates.png").read_bytes()[:4] == b"\x89PNG"
    # the passkey panel has points: the smoke gate's measured passkeys (a random model: 0, drawn at 0, where a
    # prompt fits) and the ruler gate's on the trained model
    smoke = {pt["ctx"]: pt for pt in next(g for g in res["gates"] if g["name"] == "extension-smoke")["points"]}
    assert smoke[256]["passkey_dca"] is None and smoke[1024]["passkey_dca"] in (0.0, 1.0)
    rul = next(g for g in res["gates"] if g["name"] == "ruler")
    assert any(pt["task"] == "passkey" and pt["dca"] is not None for pt in rul["points"])
    assert "PASS" in p.stdout

    p = dcaforge("gate", "--only", "noop-below-chunk", "--json")
    assert p.returncode == 0 and [g["name"] for g in json.loads(p.stdout)["gates"]] == ["noop-below-chunk"]
