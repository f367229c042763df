#!/usr/bin/env python3
"""Where a run's wall time goes when the GPU is idle, from bench/gpu/ktrace.cpp's timeline (KTRACE_TIMELINE).

    python bench/gpu/ktrace_timeline.py PLAIN.tsv DCA.tsv [--skip N] [--min-out BYTES] [--ubatch N] [--kernels N]

Each llama_decode that returns logits ends with one device-to-host copy of them; those copies (at least --min-out
bytes) cut the run into steps. llama-batched-bench's prompt returns the first of them; it begins with its first
ubatch's upload of token ids (a host-to-device copy of 4 x --ubatch bytes; the warm-up before it is left out). The
steps after it are the decode steps, less the first --skip (CUDA graphs warm up there). For the prompt and for the
mean decode step, both runs side by side:

- wall: the step's time, from the previous logits copy's end to its own;
- GPU busy: the union of every kernel's and copy's span (kernels that overlap count once), and idle = wall - busy;
- what the host was doing while the GPU was idle: inside a synchronisation call, inside a launch call (kernel or
  graph launch), inside another runtime call, or in none (its own work: graph building, inputs, scheduling);
- idle gaps by length (a launch-bound host leaves many short gaps, a per-ubatch pause a few long ones);
- the host's runtime calls: how many, and the time inside them.

--kernels N adds the decode step's GPU time per kernel name, the N largest differences first: each kernel counts the
part of its span that no earlier kernel covers (with programmatic dependent launch and CUDA graphs, spans overlap,
and their plain sum is not GPU time; these parts add up to the step's GPU busy time less its copies).
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import sys
from dataclasses import dataclass, field
from pathlib import Path

GAP_BUCKETS_US = (5.0, 50.0, 500.0)  # idle gaps shorter than each bound, the rest longer
HOST_CLASSES = ("sync", "launch", "api", "host")


@dataclass
class Event:
    type: str
    start: int
    end: int
    extra: int
    name: str


def call_class(name: str) -> str:
    low = name.lower()
    if "synchron" in low:
        return "sync"
    if "launch" in low:
        return "launch"
    return "api"


def load(path: Path) -> list[Event]:
    opener = gzip.open if path.suffix == ".gz" else open
    events: list[Event] = []
    with opener(path, "rt") as f:  # type: ignore[operator]
        header = f.readline().rstrip("\n").split("\t")
        if header[:4] != ["type", "start_ns", "end_ns", "extra"]:
            raise ValueError(f"{path}: not a ktrace timeline (header {header[:4]})")
        for n, line in enumerate(f, start=2):
            parts = line.rstrip("\n").split("\t", 4)
            if len(parts) != 5 or parts[0] not in ("k", "m", "r"):
                raise ValueError(f"{path}:{n}: bad row")
            events.append(Event(parts[0], int(parts[1]), int(parts[2]), int(parts[3]), parts[4]))
    if not any(e.type == "k" for e in events):
        raise ValueError(f"{path}: no kernels")
    return events


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def overlap(intervals: list[tuple[int, int]], starts: list[int], a: int, b: int) -> int:
    """Time of [a, b) covered by sorted, disjoint intervals (starts: their start times)."""
    i = max(0, bisect.bisect_right(starts, a) - 1)
    total = 0
    while i < len(intervals) and intervals[i][0] < b:
        lo, hi = max(a, intervals[i][0]), min(b, intervals[i][1])
        total += max(0, hi - lo)
        i += 1
    return total


@dataclass
class Step:
    start: int
    end: int
    wall: float = 0.0                       # microseconds, as every figure below
    busy: float = 0.0
    idle_by: dict[str, float] = field(default_factory=dict)
    gaps: list[int] = field(default_factory=list)           # counts per GAP_BUCKETS_US bucket (+1 for the rest)
    longest: float = 0.0
    gap_time: list[float] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)     # per host class
    call_time: dict[str, float] = field(default_factory=dict)
    kernels: int = 0


def steps_of(events: list[Event], min_out: int, ubatch: int) -> list[Step]:
    """The prompt, then each decode step."""
    cuts = sorted(e.end for e in events if e.type == "m" and e.name == "DtoH" and e.extra >= min_out)
    if len(cuts) < 2:
        raise ValueError(f"fewer than two logits copies of >= {min_out} bytes: is this a llama-batched-bench run?")
    tokens = [e.start for e in events if e.type == "m" and e.name == "HtoD" and e.extra == 4 * ubatch and e.start < cuts[0]]
    if not tokens:
        raise ValueError(f"no upload of {ubatch} token ids before the first logits copy: is --ubatch right?")
    return [Step(min(tokens), cuts[0])] + [Step(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]


def measure(events: list[Event], steps: list[Step]) -> None:
    gpu = union([(e.start, e.end) for e in events if e.type in ("k", "m")])
    gpu_starts = [a for a, _ in gpu]
    calls: dict[str, list[tuple[int, int]]] = {c: [] for c in HOST_CLASSES[:3]}
    for e in events:
        if e.type == "r":
            calls[call_class(e.name)].append((e.start, e.end))
    calls_u = {c: union(v) for c, v in calls.items()}
    calls_s = {c: [a for a, _ in v] for c, v in calls_u.items()}
    kstarts = sorted(e.start for e in events if e.type == "k")
    call_rows = sorted((e.start, e.end, call_class(e.name)) for e in events if e.type == "r")
    call_starts = [r[0] for r in call_rows]

    for st in steps:
        st.wall = (st.end - st.start) / 1e3
        busy = overlap(gpu, gpu_starts, st.start, st.end)
        st.busy = busy / 1e3
        # the idle intervals inside the step
        idle: list[tuple[int, int]] = []
        t = st.start
        i = max(0, bisect.bisect_right(gpu_starts, st.start) - 1)
        while i < len(gpu) and gpu[i][0] < st.end:
            a, b = gpu[i]
            if a > t:
                idle.append((t, min(a, st.end)))
            t = max(t, b)
            i += 1
        if t < st.end:
            idle.append((t, st.end))
        st.idle_by = {c: 0.0 for c in HOST_CLASSES}
        st.gaps = [0] * (len(GAP_BUCKETS_US) + 1)
        st.gap_time = [0.0] * (len(GAP_BUCKETS_US) + 1)
        for a, b in idle:
            covered = 0
            for c in HOST_CLASSES[:3]:
                ns = overlap(calls_u[c], calls_s[c], a, b)
                st.idle_by[c] += ns / 1e3
                covered += ns
            st.idle_by["host"] += max(0, (b - a) - covered) / 1e3
            us = (b - a) / 1e3
            st.longest = max(st.longest, us)
            k = bisect.bisect_right(GAP_BUCKETS_US, us)
            st.gaps[k] += 1
            st.gap_time[k] += us
        st.calls = {c: 0 for c in HOST_CLASSES[:3]}
        st.call_time = {c: 0.0 for c in HOST_CLASSES[:3]}
        j = bisect.bisect_left(call_starts, st.start)
        while j < len(call_rows) and call_rows[j][0] < st.end:
            a, b, c = call_rows[j]
            st.calls[c] += 1
            st.call_time[c] += (min(b, st.end) - a) / 1e3
            j += 1
        st.kernels = bisect.bisect_left(kstarts, st.end) - bisect.bisect_left(kstarts, st.start)


@dataclass
class Summary:
    label: str
    n: int
    wall: float
    busy: float
    idle_by: dict[str, float]
    gaps: list[float]
    gap_time: list[float]
    longest: float
    calls: dict[str, float]
    call_time: dict[str, float]
    kernels: float


def mean(label: str, steps: list[Step]) -> Summary:
    n = len(steps)
    if n == 0:
        raise ValueError(f"no {label} steps")
    return Summary(
        label, n,
        sum(s.wall for s in steps) / n,
        sum(s.busy for s in steps) / n,
        {c: sum(s.idle_by[c] for s in steps) / n for c in HOST_CLASSES},
        [sum(s.gaps[k] for s in steps) / n for k in range(len(GAP_BUCKETS_US) + 1)],
        [sum(s.gap_time[k] for s in steps) / n for k in range(len(GAP_BUCKETS_US) + 1)],
        sum(s.longest for s in steps) / n,
        {c: sum(s.calls[c] for s in steps) / n for c in HOST_CLASSES[:3]},
        {c: sum(s.call_time[c] for s in steps) / n for c in HOST_CLASSES[:3]},
        sum(s.kernels for s in steps) / n,
    )


@dataclass
class Run:
    name: str
    events: list[Event]
    steps: list[Step]  # the prompt, then the decode steps, measured


def open_run(path: Path, min_out: int, ubatch: int) -> Run:
    """One timeline, read, cut and measured once for every report."""
    events = load(path)
    steps = steps_of(events, min_out, ubatch)
    measure(events, steps)
    return Run(path.name, events, steps)


def kernel_time(events: list[Event], steps: list[Step]) -> dict[str, float]:
    """Mean microseconds per step of each kernel name's span not covered by an earlier kernel."""
    acc: dict[str, float] = {}
    ks = sorted((e.start, e.end, e.name) for e in events if e.type == "k")
    starts = [k[0] for k in ks]
    for st in steps:
        cur = st.start
        for a, b, name in ks[bisect.bisect_left(starts, st.start):bisect.bisect_left(starts, st.end)]:
            lo = max(a, cur)
            if b > lo:
                acc[name] = acc.get(name, 0.0) + (b - lo) / 1e3
                cur = b
    return {k: v / max(1, len(steps)) for k, v in acc.items()}


def kernels_report(a_run: Run, b_run: Run, skip: int, n: int) -> str:
    a, b = (kernel_time(r.events, r.steps[1 + skip:]) for r in (a_run, b_run))
    names = sorted(set(a) | set(b), key=lambda k: (-abs(b.get(k, 0.0) - a.get(k, 0.0)), k))
    lines = ["", f"decode step, GPU time per kernel (us, not covered by an earlier kernel): plain {sum(a.values()):.1f}, "
             f"dca {sum(b.values()):.1f}", "dca - plain\tplain\tdca\tkernel"]
    for k in names[:n]:
        lines.append(f"{b.get(k, 0.0) - a.get(k, 0.0):+.1f}\t{a.get(k, 0.0):.1f}\t{b.get(k, 0.0):.1f}\t{k}")
    return "\n".join(lines) + "\n"


def phases(run: Run, skip: int) -> tuple[Summary, Summary]:
    return mean("prompt", run.steps[:1]), mean("decode step", run.steps[1 + skip:])


def rows(s: Summary) -> list[tuple[str, float]]:
    out = [("wall", s.wall), ("GPU busy", s.busy), ("GPU idle", s.wall - s.busy)]
    names = {"sync": "  host in a synchronisation", "launch": "  host in a launch call",
             "api": "  host in another runtime call", "host": "  host in no runtime call"}
    out += [(names[c], s.idle_by[c]) for c in HOST_CLASSES]
    bounds = ("< 5 us", "5-50 us", "50-500 us", ">= 500 us")
    out += [(f"idle gaps {b}: count", s.gaps[k]) for k, b in enumerate(bounds)]
    out += [(f"idle gaps {b}: time", s.gap_time[k]) for k, b in enumerate(bounds)]
    out += [("longest idle gap", s.longest)]
    out += [("kernels", s.kernels)]
    out += [(f"{c} calls", s.calls[c]) for c in HOST_CLASSES[:3]]
    out += [(f"time in {c} calls", s.call_time[c]) for c in HOST_CLASSES[:3]]
    return out


def report(a_run: Run, b_run: Run, skip: int) -> str:
    a = phases(a_run, skip)
    b = phases(b_run, skip)
    lines = [f"plain: {a_run.name}   dca: {b_run.name}   (microseconds and counts; decode: the mean step)"]
    for sa, sb in zip(a, b, strict=True):
        lines.append("")
        lines.append(f"{sa.label} (plain {sa.n} step(s), dca {sb.n})\tplain\tdca\tdca - plain")
        for (name, va), (_, vb) in zip(rows(sa), rows(sb), strict=True):
            lines.append(f"{name}\t{va:.1f}\t{vb:.1f}\t{vb - va:+.1f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("plain", type=Path)
    ap.add_argument("dca", type=Path)
    ap.add_argument("--skip", type=int, default=3, help="decode steps left out after the prompt (CUDA graph warm-up)")
    ap.add_argument("--min-out", type=int, default=16384, help="smallest device-to-host copy that ends a step (bytes)")
    ap.add_argument("--ubatch", type=int, default=512, help="the run's -ub (its prompt uploads 4 x ubatch bytes of ids)")
    ap.add_argument("--kernels", type=int, default=0, help="also the decode step's time per kernel, N rows")
    args = ap.parse_args(argv)
    try:
        plain = open_run(args.plain, args.min_out, args.ubatch)
        dca = open_run(args.dca, args.min_out, args.ubatch)
        sys.stdout.write(report(plain, dca, args.skip))
        if args.kernels > 0:
            sys.stdout.write(kernels_report(plain, dca, args.skip, args.kernels))
    except (OSError, ValueError) as e:
        print(f"ktrace_timeline: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
