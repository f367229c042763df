"""The RULER-style tasks without a server: the generators are deterministic and hold their answers,
the sizing fits a budget under a real tokenizer (the byte-level one of the test models: BOS + one
token per byte), exact-match scoring, the gate schema, and the server wrapper's failure path."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from dcaforge import ruler
from dcaforge.config import parse_config
from dcaforge.errors import ConfigError, GateError
from dcaforge.gate.server import LlamaServer

from .helpers import minimal_config


def byte_tokens(text: str) -> int:
    """The tokenizer of tests/models/longctx-qwen2.gguf and the tiny models: BOS, then one token per byte."""
    return 1 + len(text.encode("utf-8"))


@pytest.mark.parametrize("task", ruler.TASKS)
def test_generate_is_deterministic_and_holds_the_answer(task: str) -> None:
    a = ruler.generate(task, 42, 0, 40, n_samples=4)
    assert a == ruler.generate(task, 42, 0, 40, n_samples=4)
    assert ruler.generate(task, 42, 1, 40, n_samples=4).prompt != a.prompt
    assert ruler.generate(task, 7, 0, 40, n_samples=4).prompt != a.prompt
    assert a.prompt.count(ruler.NOISE) == 40 + (5 if task == "vt" else 0)  # vt: the solved example's 5 sentences
    for item in a.expected:
        assert ruler.found(item, a.question), (task, item)
    assert 0.0 <= a.depth < 1.0
    # more filler, same needles: the answer does not depend on the length
    assert ruler.generate(task, 42, 0, 400, n_samples=4).expected == a.expected


def test_vt_chain_and_niah_needles() -> None:
    s = ruler.generate("vt", 42, 3, 60, fewshot=False)
    names = s.expected
    assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
    value = re.search(r"VAR " + names[0] + r" = (\d{5})", s.question).group(1)
    assert s.question.index(f"VAR {names[0]} = {value}") < s.question.index(f"VAR {names[1]} = VAR {names[0]}")
    for a, b in zip(names, names[1:], strict=False):
        assert f"VAR {b} = VAR {a} " in s.question
    assert s.answer_prefix == (" Answer: According to the chain(s) of variable assignment in the text above, "
                               f"5 variables are assigned the value {value}, they are: ")
    assert "Memorize and track" in s.question and s.question.count("Memorize and track") == 1
    assert ruler.generate("vt", 42, 3, 60).question.count("Memorize and track") == 2  # with the solved example

    mk = ruler.generate("niah_multikey", 42, 0, 50)
    needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", mk.question)
    assert len(needles) == 4 and len({k for k, _ in needles}) == 4
    query = re.search(r"What is the special magic number for ([a-z]+-[a-z]+) mentioned", mk.question).group(1)
    assert mk.expected == tuple(v for k, v in needles if k == query)
    assert mk.answer_prefix == f" The special magic number for {query} mentioned in the provided text is"

    mv = ruler.generate("niah_multivalue", 42, 0, 50)
    needles = re.findall(r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\.", mv.question)
    assert len(needles) == 4 and len({k for k, _ in needles}) == 1
    assert sorted(mv.expected) == sorted(v for _, v in needles)
    assert "What are all the special magic numbers for" in mv.question

    depths = [ruler.generate("passkey", 42, i, 100, n_samples=4).depth for i in range(4)]
    assert depths == [0.12, 0.37, 0.62, 0.87]  # (i + 0.5) / n of the junk
    pk = ruler.generate("passkey", 42, 0, 3)
    assert pk.prompt.endswith("What is the pass key? The pass key is")
    assert f"The pass key is {pk.expected[0]}. Remember it. {pk.expected[0]} is the pass key." in pk.question


def test_too_little_filler_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        ruler.generate("vt", 1, 0, 3)
    with pytest.raises(ValueError, match="at least 4"):
        ruler.generate("niah_multivalue", 1, 0, 2)
    with pytest.raises(ValueError, match="unknown task"):
        ruler.generate("qa", 1, 0, 10)


@pytest.mark.parametrize("task", ruler.TASKS)
@pytest.mark.parametrize("budget", [900, 2048, 8000, 131072])
def test_fit_fills_the_budget(task: str, budget: int) -> None:
    calls: list[int] = []

    def measure(n: int) -> int:
        calls.append(n)
        return byte_tokens(ruler.generate(task, 42, 0, n, n_samples=4).prompt)

    got = ruler.fit(measure, budget, probe=ruler.min_filler(task))
    smallest = measure(ruler.min_filler(task))
    if smallest > budget:
        assert got is None
        return
    assert got is not None
    n, t = got
    assert t == measure(n) <= budget
    assert measure(n + 1) > budget  # the largest that fits
    assert len(calls) <= 2 + 6 + 3  # two probes, a few checks (+ this test's own three)


def test_fit_none_when_nothing_fits() -> None:
    assert ruler.fit(lambda n: 1000 + n, 500, probe=1) is None


def test_score_is_whole_word_exact_match() -> None:
    assert ruler.score(("12345",), "The pass key is 12345.") == (1.0, True)
    assert ruler.score(("12345",), "The pass key is 123456.") == (0.0, False)
    assert ruler.score(("12345",), "1234512345") == (0.0, False)
    assert ruler.score(("ABCDE", "FGHIJ"), " ABCDE, XFGHIJ ") == (0.5, False)
    assert ruler.score(("ABCDE", "FGHIJ"), "FGHIJ ABCDE") == (1.0, True)
    assert ruler.score(("1111111", "2222222", "3333333", "4444444"), "1111111, 3333333 and 9") == (0.5, False)


GATE_CONFIG = minimal_config() + """\
gates:
  - name: r
    kind: ruler
    model: m.gguf
"""


def test_ruler_gate_schema(tmp_path: Path) -> None:
    p = tmp_path / "dcaforge.yaml"
    p.write_text(GATE_CONFIG + "    tasks: [vt, niah_multikey]\n    scales: [1, 4, 8]\n    methods: [plain, dca]\n"
                 "    samples: 2\n    score_min: 0.5\n    chat: true\n")
    g = parse_config(p).gates[0]
    assert g.kind == "ruler" and g.options["tasks"] == ["vt", "niah_multikey"] and g.options["chat"] is True
    for extra, msg in (("    tasks: [vt, qa]\n", "takes vt, niah_single"),
                       ("    methods: [plain, plain]\n", "each once"),
                       ("    methods: [rope]\n", "takes plain, yarn, dca"),
                       ("    scales: [1, -4]\n", "positive numbers"),
                       ("    contexts: [1024, 2.5]\n", "positive token counts"),
                       ("    send: json\n", "takes tokens, text"),
                       ("    samples: many\n", "must be an integer"),
                       ("    text: t.txt\n", "text")):
        p.write_text(GATE_CONFIG + extra)
        with pytest.raises(ConfigError) as ei:
            parse_config(p)
        assert msg in ei.value.message, (extra, ei.value.message)


def test_server_that_exits_is_reported_with_its_log(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with pytest.raises(GateError) as ei:
        with LlamaServer(Path("/bin/false"), ["-m", "x.gguf"], log, load_timeout=10):
            pass
    assert "exited (status 1) before it was ready" in ei.value.message
    assert log.read_text().startswith("$ /bin/false -m x.gguf --host 127.0.0.1 --port ")


def test_server_that_dies_of_sigill_says_how_to_build_one_this_machine_runs(tmp_path: Path) -> None:
    """A server killed by SIGILL (a native build on a machine that does not run one of its instructions: AMX here, see
    docs/workflow.md) gets a hint that names the portable build; another exit gets none."""
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\nkill -ILL $$\n")
    exe.chmod(0o755)
    with pytest.raises(GateError) as ei:
        with LlamaServer(exe, ["-m", "x.gguf"], tmp_path / "server.log", load_timeout=10):
            pass
    assert f"exited (status -{signal.SIGILL}) before it was ready" in ei.value.message
    assert ei.value.hint is not None and "GGML_NATIVE: OFF" in ei.value.hint and "dcaforge build" in ei.value.hint
    with pytest.raises(GateError) as ei:
        with LlamaServer(Path("/bin/false"), ["-m", "x.gguf"], tmp_path / "server2.log", load_timeout=10):
            pass
    assert ei.value.hint is None


def word_tokens(text: str) -> int:
    """A word-level tokenizer (words and punctuation): another real tokenization, coarser than bytes."""
    return 1 + len(re.findall(r"\w+|[^\w\s]", text))


@pytest.mark.parametrize("task", ["vt", "niah_multikey"])
@pytest.mark.parametrize("budget", [4096, 1_048_576 - 128])
def test_fit_with_slack_counts_a_long_prompt_once_or_twice(task: str, budget: int) -> None:
    counted: list[int] = []

    def measure(n: int) -> int:
        t = word_tokens(ruler.generate(task, 42, 0, n).prompt)
        counted.append(t)
        return t

    n, t = ruler.fit(measure, budget, probe=ruler.min_filler(task), slack=budget // 1000)
    assert budget - max(budget // 1000, 30) <= t <= budget
    assert sum(c > budget // 4 for c in counted) <= 2  # the long prompt is tokenized at most twice
