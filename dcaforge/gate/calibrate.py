"""``dcaforge calibrate MODEL.gguf``: DCA's sizes measured on the user's own model, written into a copy of its GGUF so
that ``--dca on`` alone uses them.

1. **Checks first** (nothing is run before they pass; the input is only ever read): the file is a GGUF that reads
   whole (:func:`inspect_gguf`), its architecture is one 0078 serves (:data:`SUPPORTED_ARCHS`, as
   ``llama_dca_arch_supported``) and its attention is one DCA's regimes reproduce (no ALiBi, attention sinks, MLA or
   KQ bias: the keys and tensor names ``llama_dca_unsupported_attn`` reads), the output is a new path (``force`` to
   replace one; never the input), and the llama-server given knows ``--dca``.
2. **Dev sweep** (:func:`plan`): chunk sizes S in {L/16, L/8, L/4, L/2} (at least 512, at most 262144 and L; the
   GGUF's own sizes too, when it has some), local window w = S/8, attention temperature off; passkey trials
   (dcaforge/gate/longctx.py: a fresh random key and depth per trial, a token-exact prompt in real text, strict scoring)
   at ~2.5x and ~5x L of the dev text, and, when llama-perplexity is there, the dev text's perplexity at ~2.5x L.
3. **Pick** with the rule the bench uses (:func:`dcaforge.gate.longctx.choose`): the most exact answers; among those
   within 10% of the trials of the best, the lowest dev perplexity; then the larger S.
4. **Held-out check**: the pick beside YaRN at ~3x and ~6x L of another text (its own seed, keys, depths and
   lengths). It is reported, never used to choose.
5. **Write** a copy of the GGUF with ``<arch>.attention.dual_chunk.chunk_size`` and ``.local_size`` (uint32) set,
   every other key and every tensor as they were (:func:`write_dca_copy`, checked by reading the copy back), through
   a temporary file, so an interrupted run leaves no half-written output.

L is the context 0078 derives DCA's sizes from: ``<arch>.attention.dual_chunk.original_context_length``, else
``<arch>.rope.scaling.original_context_length``, else ``<arch>.context_length`` (``llama_dca_resolve``).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dcaforge.config import Config
from dcaforge.errors import CalibrateError, GateError
from dcaforge.gate import longctx
from dcaforge.gate.perplexity import parse_perplexity
from dcaforge.gate.server import HttpError, LlamaServer
from dcaforge.git import run
from dcaforge.room.cleanroom import Room

#: the architectures 0078 serves (templates/dca/files/src/llama-dca.cpp.j2, llama_dca_arch_supported)
SUPPORTED_ARCHS = ("gemma4", "gemma3", "qwen2", "qwen3", "qwen3moe", "llama")
KEY_CHUNK = "{arch}.attention.dual_chunk.chunk_size"
KEY_LOCAL = "{arch}.attention.dual_chunk.local_size"
KEY_DCA_ORIG = "{arch}.attention.dual_chunk.original_context_length"
KEY_ROPE_ORIG = "{arch}.rope.scaling.original_context_length"
KEY_CTX = "{arch}.context_length"

#: the chunk sizes tried: these fractions of L, clamped to [MIN_CHUNK, MAX_CHUNK] (for L < 4096: [L/8, L/2])
FRACTIONS = (16, 8, 4, 2)
MIN_CHUNK = 512
MAX_CHUNK = 262144
#: the local window of a chunk size S: S / LOCAL_DIV
LOCAL_DIV = 8
#: prompt lengths as multiples of L: dev and held-out never share one. Under the cap (max_tokens) each is at most
#: L + share x (cap - L), so that capped lengths stay past L, apart, and dev below held-out
DEV_MULTS = (2.5, 5.0)
HELDOUT_MULTS = (3.0, 6.0)
DEV_CAP_SHARE = (0.42, 0.83)
HELDOUT_CAP_SHARE = (0.5, 1.0)
#: the trial sets' seeds (and names): their own, apart from the bench's (bench/longctx/sets.yaml)
DEV_SET, DEV_SEED = "calibrate-dev", 20261207
HELDOUT_SET, HELDOUT_SEED = "calibrate-heldout", 5550123
DEFAULT_DEV_TRIALS = 10           # per dev length: 20 per candidate
DEFAULT_HELDOUT_TRIALS = 10       # per held-out length: 20 for the pick, 20 for YaRN
DEFAULT_MAX_TOKENS = 262144
DEFAULT_SERVER_ARGS = ("-ngl", "99", "-fa", "on")
#: the plan's time estimate: prompt processing on one H100/H200 for a model of ~300M parameters, and a server start
SECONDS_PER_100K_TOKENS = 3.0
SECONDS_PER_SERVER = 8.0
SECONDS_PER_PPL = 25.0
#: the text tokenized for prompts: this many characters per token of the longest prompt (at least MIN_TEXT_CHARS)
TEXT_CHARS_PER_TOKEN = 6
MIN_TEXT_CHARS = 50_000


# --- reading the GGUF ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GgufInfo:
    path: Path
    size: int
    arch: str
    context_length: int
    trained: int                  # L, as 0078 reads it
    trained_key: str              # the key L came from
    chunk: int | None             # the GGUF's own DCA sizes, if any
    local: int | None
    n_tensors: int
    n_kv: int


def _fields(reader: Any) -> dict[str, Any]:
    """The key/values of a GGUFReader (its virtual GGUF.* fields left out), as Python values."""
    out: dict[str, Any] = {}
    for f in reader.fields.values():
        if not f.name.startswith("GGUF."):
            try:
                out[f.name] = f.contents()
            except (ValueError, IndexError, TypeError):
                out[f.name] = None
    return out


def _read(path: Path) -> Any:
    """A GGUFReader of ``path`` (read-only), or the refusal: not a file, not a GGUF, truncated or damaged."""
    if not path.exists():
        raise CalibrateError(f"{path} does not exist", where=str(path), hint="give the path of a .gguf model file")
    if not path.is_file():
        raise CalibrateError(f"{path} is not a file", where=str(path), hint="give the path of a .gguf model file")
    try:
        with open(path, "rb") as fh:
            head = fh.read(4)
    except OSError as exc:
        raise CalibrateError(f"{path} cannot be read: {exc.strerror}", where=str(path)) from None
    if head != b"GGUF":
        raise CalibrateError(f"{path} is not a GGUF file (it starts with {head!r}; a GGUF file starts with b'GGUF')",
                             where=str(path), hint="give a .gguf model file (convert a Hugging Face model with "
                                                   "llama.cpp's convert_hf_to_gguf.py)")
    import gguf

    try:
        reader = gguf.GGUFReader(path, "r")
        size = path.stat().st_size
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as exc:  # gguf-py raises ValueError, IndexError, struct errors... on a short or damaged file
        raise CalibrateError(f"{path} is truncated or damaged: its GGUF header or tensors do not read",
                             where=str(path), details=f"{type(exc).__name__}: {exc}"[:500],
                             hint="download or convert the model again (compare its size and sha256 with the "
                                  "source's)") from None
    if end > size:
        raise CalibrateError(f"{path} is truncated: its tensors end at byte {end}, the file has {size}",
                             where=str(path), hint="download or convert the model again")
    return reader


def inspect_gguf(path: Path) -> GgufInfo:
    """What calibrate needs of a GGUF file, or the refusal: not a GGUF, truncated, split, an architecture or an
    attention DCA cannot serve, no context length."""
    reader = _read(path)
    kv = _fields(reader)
    names = [t.name for t in reader.tensors]
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise CalibrateError(f"{path} has no general.architecture", where=str(path))
    if int(kv.get("split.count") or 1) > 1:
        raise CalibrateError(f"{path} is one part of a split GGUF ({kv.get('split.count')} parts)", where=str(path),
                             hint="merge it first: llama-gguf-split --merge FIRST-PART.gguf MERGED.gguf")
    why = unsupported_attention(arch, kv, names)
    if why:
        raise CalibrateError(f"architecture '{arch}' uses {why}, which DCA's regime attentions do not apply: "
                             "DCA cannot serve this model", where=str(path),
                             hint="run this model with --dca off (plain rope, or YaRN: --rope-scaling yarn)")
    if arch not in SUPPORTED_ARCHS:
        raise CalibrateError(f"architecture '{arch}' is not one DCA serves (supported: {', '.join(SUPPORTED_ARCHS)})",
                             where=str(path), hint="run this model with --dca off (plain rope, or YaRN: --rope-scaling yarn)")

    def u32(key: str) -> int | None:
        v = kv.get(key.format(arch=arch))
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    ctx = u32(KEY_CTX)
    if ctx is None:
        raise CalibrateError(f"{path} has no {KEY_CTX.format(arch=arch)} (the trained context)", where=str(path))
    trained, key = ctx, KEY_CTX
    for k in (KEY_ROPE_ORIG, KEY_DCA_ORIG):
        v = u32(k)
        if v is not None:
            trained, key = v, k
    return GgufInfo(path=path, size=path.stat().st_size, arch=arch, context_length=ctx, trained=trained,
                    trained_key=key.format(arch=arch), chunk=u32(KEY_CHUNK), local=u32(KEY_LOCAL),
                    n_tensors=len(names), n_kv=len(kv))


def unsupported_attention(arch: str, kv: dict[str, Any], tensors: Sequence[str]) -> str:
    """What in a model's keys or tensor names DCA cannot apply ("" when nothing): ALiBi, attention sinks, multi-head
    latent attention, relative position biases added to KQ (as llama_dca_unsupported_attn reads them when loaded)."""
    def num(key: str) -> float:
        v = kv.get(key.format(arch=arch))
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

    if num("{arch}.attention.max_alibi_bias") > 0:
        return f"ALiBi position biases ({arch}.attention.max_alibi_bias = {num('{arch}.attention.max_alibi_bias'):g})"
    sinks = [t for t in tensors if re.fullmatch(r"blk\.\d+\.attn_sinks(\.weight)?", t)]
    if sinks:
        return f"attention sinks ({sinks[0]})"
    mla = [t for t in tensors if re.fullmatch(r"blk\.\d+\.(attn_kv_a_mqa|attn_k_b|attn_v_b)\.weight", t)]
    if num("{arch}.attention.kv_lora_rank") > 0 or f"{arch}.attention.key_length_mla" in kv or mla:
        return "multi-head latent attention (MLA: " + (mla[0] if mla else f"{arch}.attention.kv_lora_rank") + ")"
    rel = [t for t in tensors if re.fullmatch(r"(enc|dec)\.blk\.\d+\.(cross_)?attn_rel_b(\.weight)?", t)]
    if num("{arch}.attention.relative_buckets_count") > 0 or rel:
        return "relative position biases added to KQ (" + (rel[0] if rel else f"{arch}.attention.relative_buckets_count") + ")"
    return ""


# --- writing the copy ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CopyResult:
    path: Path
    chunk: int
    local: int
    n_kv: int
    n_tensors: int
    tensor_bytes: int


def write_dca_copy(src: Path, dst: Path, chunk: int, local: int) -> CopyResult:
    """Write ``dst``: ``src`` with ``<arch>.attention.dual_chunk.chunk_size = chunk`` and ``.local_size = local``
    (uint32), every other key, every tensor and the alignment as they were; checked by reading ``dst`` back (the
    keys, the values, every tensor's bytes), through a temporary file beside ``dst`` that an error or an interrupt
    removes. ``src`` is only read."""
    import gguf

    if chunk <= 0 or local <= 0 or local >= chunk:
        raise ValueError(f"chunk {chunk}, local {local}: need 0 < local < chunk")
    reader = _read(src)
    kv = _fields(reader)
    arch = str(kv["general.architecture"])
    new = {KEY_CHUNK.format(arch=arch): chunk, KEY_LOCAL.format(arch=arch): local}
    tmp = dst.parent / f".{dst.name}.tmp-{os.getpid()}"
    try:
        writer = gguf.GGUFWriter(tmp, arch, endianess=reader.endianess)
        writer.data_alignment = int(reader.alignment)
        for f in reader.fields.values():
            if f.name == gguf.Keys.General.ARCHITECTURE or f.name.startswith("GGUF.") or f.name in new:
                continue  # the writer writes the architecture itself; GGUF.* are the reader's virtual fields
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(f.name, f.contents(), vtype, sub_type=sub)
        for key, value in new.items():
            writer.add_key_value(key, value, gguf.GGUFValueType.UINT32)
        for t in reader.tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data(t.data, tensor_endianess=reader.endianess)
        writer.close()
        res = verify_copy(src, tmp, new)
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return CopyResult(dst, chunk, local, res[0], res[1], res[2])


def verify_copy(src: Path, dst: Path, new: dict[str, int]) -> tuple[int, int, int]:
    """(keys, tensors, tensor bytes) of ``dst`` once it is checked against ``src``: the same keys and values but
    ``new`` (uint32 there), the same tensors (name, type, shape, bytes) in the same order. CalibrateError otherwise."""
    import gguf

    a, b = _read(src), _read(dst)
    ka, kb = _fields(a), _fields(b)
    want = {**{k: v for k, v in ka.items() if k not in new}, **new}
    bad = sorted(k for k in set(want) | set(kb) if want.get(k) != kb.get(k))
    for k in new:
        fld = b.fields.get(k)
        if fld is None or fld.types != [gguf.GGUFValueType.UINT32]:
            bad.append(f"{k} (type)")
    if [t.name for t in a.tensors] != [t.name for t in b.tensors]:
        bad.append("tensor names")
    total = 0
    with open(src, "rb") as fa, open(dst, "rb") as fb:
        for ta, tb in zip(a.tensors, b.tensors, strict=False):
            if ta.tensor_type != tb.tensor_type or list(ta.shape) != list(tb.shape) or ta.n_bytes != tb.n_bytes:
                bad.append(f"tensor {ta.name} (type or shape)")
                continue
            fa.seek(int(ta.data_offset))
            fb.seek(int(tb.data_offset))
            left = int(ta.n_bytes)
            while left > 0:
                n = min(left, 16 << 20)
                if fa.read(n) != fb.read(n):
                    bad.append(f"tensor {ta.name} (bytes)")
                    break
                left -= n
            total += int(ta.n_bytes)
    if bad:
        raise CalibrateError(f"the copy {dst} does not read back as written", where=str(dst),
                             details="differs in: " + ", ".join(bad[:20]), hint="report this: it is a bug")
    return len(kb), len(b.tensors), total


# --- the plan ---------------------------------------------------------------------------------------------------------

def candidate_chunks(trained: int, explicit: Sequence[int] = (), own: int | None = None) -> list[int]:
    """The chunk sizes of the sweep: ``explicit`` when given, else L/16, L/8, L/4, L/2 clamped to
    [min(MIN_CHUNK, L/8), min(MAX_CHUNK, L)]; plus the GGUF's own chunk size when it fits L. Sorted, each once."""
    if explicit:
        chunks = {int(s) for s in explicit}
    else:
        lo, hi = min(MIN_CHUNK, trained // 8), min(MAX_CHUNK, trained)
        chunks = {max(lo, min(hi, trained // f)) for f in FRACTIONS}
    if own is not None and own <= trained:
        chunks.add(own)
    return sorted(s for s in chunks if s > 0)


def local_for(chunk: int) -> int:
    return max(1, chunk // LOCAL_DIV)


@dataclass(frozen=True)
class Plan:
    trained: int
    candidates: tuple[str, ...]       # dca:S:W, temperature off
    dev_lengths: tuple[int, ...]
    heldout_lengths: tuple[int, ...]
    dev_trials: int                   # per dev length and candidate
    heldout_trials: int               # per held-out length and method
    ppl_ctx: int | None               # the dev perplexity's context (None: not measured)
    slack: int                        # the rule's slack: 10% of a candidate's dev trials
    estimate_seconds: float

    @property
    def total_trials(self) -> int:
        return (len(self.candidates) * len(self.dev_lengths) * self.dev_trials
                + 2 * len(self.heldout_lengths) * self.heldout_trials)


def plan(info: GgufInfo, *, chunks: Sequence[int] = (), dev_trials: int = DEFAULT_DEV_TRIALS,
         heldout_trials: int = DEFAULT_HELDOUT_TRIALS, max_tokens: int = DEFAULT_MAX_TOKENS,
         perplexity: bool = True) -> Plan:
    """The sweep for ``info``'s model (see the module), or the refusal when it cannot go past L."""
    L = info.trained
    if dev_trials < 1 or heldout_trials < 1:
        raise CalibrateError(f"the trial counts must be at least 1 (dev {dev_trials}, held-out {heldout_trials})")
    for s in chunks:
        if s <= 2 * LOCAL_DIV or s > L:
            raise CalibrateError(f"chunk size {s} is outside (16, L = {L}] ({info.trained_key})",
                                 hint=f"give chunk sizes between 17 and {L}, e.g. --chunks {max(17, L // 8)},{max(17, L // 2)}")
    sizes = candidate_chunks(L, chunks, info.chunk)
    if not sizes or sizes[-1] <= 2 * LOCAL_DIV:
        raise CalibrateError(f"the trained context L = {L} ({info.trained_key}) is too small for DCA", where=str(info.path))
    if max_tokens < 2 * L:
        raise CalibrateError(f"--max-tokens {max_tokens} leaves no room past the trained context L = {L} "
                             f"({info.trained_key}): calibration measures prompts past L, up to 6 L",
                             where=str(info.path), hint=f"raise --max-tokens to at least {2 * L} ({6 * L} measures "
                                                        "every length)")

    def lengths(mults: Sequence[float], shares: Sequence[float]) -> tuple[int, ...]:
        return tuple(sorted({int(min(m * L, L + s * (max_tokens - L))) for m, s in zip(mults, shares, strict=True)}))

    dev, held = lengths(DEV_MULTS, DEV_CAP_SHARE), lengths(HELDOUT_MULTS, HELDOUT_CAP_SHARE)
    cands = tuple(longctx.dca_method(s, local_for(s)) for s in sizes)
    tokens = len(cands) * dev_trials * sum(dev) + 2 * heldout_trials * sum(held)
    servers = len(cands) * len(dev) + 2 * len(held)
    ppl_ctx = dev[0] if perplexity else None
    est = tokens / 100_000 * SECONDS_PER_100K_TOKENS + servers * SECONDS_PER_SERVER + (len(cands) * SECONDS_PER_PPL if ppl_ctx else 0)
    slack = max(1, round(0.1 * dev_trials * len(dev)))
    return Plan(L, cands, dev, held, dev_trials, heldout_trials, ppl_ctx, slack, round(est))


# --- running ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Text:
    """A text of the protocol: where it came from (a file, the room's llama.cpp sources, Python's documentation)."""

    name: str
    text: str


@dataclass(frozen=True)
class Options:
    model: Path
    server: Path                       # a llama-server built with 0078-dca
    dev: Text
    heldout: Text
    out: Path | None = None            # default: <model dir>/<stem>.dca.gguf
    force: bool = False                # replace an existing output
    perplexity: Path | None = None     # llama-perplexity, for the dev perplexity (None: not measured)
    chunks: tuple[int, ...] = ()       # the candidates' chunk sizes (default: candidate_chunks)
    dev_trials: int = DEFAULT_DEV_TRIALS
    heldout_trials: int = DEFAULT_HELDOUT_TRIALS
    max_tokens: int = DEFAULT_MAX_TOKENS
    server_args: tuple[str, ...] = DEFAULT_SERVER_ARGS
    work: Path | None = None           # logs, trials, report, figure; default <out without .gguf>.calibrate/
    load_timeout: float = 600.0
    server_from: str = "--server"      # where ``server`` came from, for messages


@dataclass
class Hooks:
    on_plan: Callable[[Plan], None] | None = None
    on_step: Callable[[str], None] | None = None
    on_trial: Callable[[dict[str, Any]], None] | None = None   # each trial's record, as it is scored


def default_out(model: Path) -> Path:
    return model.with_name((model.name[:-5] if model.name.endswith(".gguf") else model.name) + ".dca.gguf")


def default_work(out: Path) -> Path:
    return out.with_name((out.name[:-5] if out.name.endswith(".gguf") else out.name) + ".calibrate")


def check_output(model: Path, out: Path, force: bool) -> None:
    """The output must be a new file (``force``: or a file to replace), never the input, in a folder that exists."""
    same = out.resolve() == model.resolve() or (out.exists() and model.exists() and os.path.samefile(out, model))
    if same:
        raise CalibrateError(f"the output {out} is the input model", where=str(out),
                             hint="give another output path with -o (the input is never changed)")
    if out.is_dir():
        raise CalibrateError(f"the output {out} is a folder", where=str(out), hint="give a file path with -o")
    if out.exists() and not force:
        raise CalibrateError(f"the output {out} exists", where=str(out),
                             hint="pass --force to replace it, or give another path with -o")
    if not out.parent.is_dir():
        raise CalibrateError(f"the output's folder {out.parent} does not exist", where=str(out),
                             hint="create it, or give another path with -o")


def check_server(exe: Path, source: str) -> None:
    """``exe`` must be a llama-server that knows ``--dca`` (built with 0078-dca)."""
    hint = ('`dcaforge build --targets "llama-server llama-perplexity"` (the clean room\'s build), or pass --server '
            'PATH to a llama-server built with 0078-dca')
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise CalibrateError(f"no llama-server at {exe} ({source})", where=str(exe), hint=hint)
    res = run([exe, "--help"], exe.parent, check=False)
    text = res.stdout + res.stderr
    if "--dca" not in text:
        raise CalibrateError(f"{exe} does not know --dca: it was not built with 0078-dca", where=str(exe),
                             details="\n".join(text.strip().splitlines()[-5:]), hint=hint)


def room_server(cfg: Config) -> tuple[Path, Path]:
    """(llama-server, llama-perplexity) of the clean room's build (``dcaforge build``); they may not exist."""
    bin_dir = Room.of(cfg).path / cfg.build.cmake.dir / "bin"
    return bin_dir / "llama-server", bin_dir / "llama-perplexity"


def room_dev_text(cfg: Config) -> Text:
    """The dev text from the clean room's llama.cpp sources (:func:`dcaforge.gate.longctx.dev_text`)."""
    room = Room.of(cfg)
    tree = room.path / cfg.llama_cpp_dir
    if not room.exists():
        raise CalibrateError(f"no clean room at {room.path} to take the dev text from (its llama.cpp sources)",
                             where=cfg.describe(), hint="`dcaforge apply`, or pass --dev-text FILE (any long text)")
    try:
        return Text(f"llama.cpp sources of {tree}", longctx.dev_text(tree))
    except ValueError as exc:
        raise CalibrateError(str(exc), where=str(tree), hint="pass --dev-text FILE (any long text)") from None


def python_docs_text() -> Text:
    """The held-out text: this Python's documentation (:func:`dcaforge.gate.longctx.heldout_text`)."""
    import sys

    return Text(f"Python {sys.version.split()[0]} documentation", longctx.heldout_text())


def file_text(path: Path, what: str) -> Text:
    try:
        return Text(str(path), path.read_text(encoding="utf-8", errors="replace"))
    except OSError as exc:
        raise CalibrateError(f"the {what} {path} cannot be read: {exc.strerror}", where=str(path)) from None


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

    @staticmethod
    def total(cells: dict[int, longctx.Score]) -> longctx.Score:
        return longctx.Score(sum(s.k for s in cells.values()), sum(s.n for s in cells.values()))

    @property
    def verdict(self) -> str:
        """The held-out check in a line: the pick's score beside YaRN's."""
        p, y = self.total(self.heldout[self.choice.pick]), self.total(self.heldout["yarn"])
        if p.k > y.k:
            word = "above"
        elif p.k == y.k:
            word = "level with"
        else:
            word = "BELOW"
        return f"held-out: {self.choice.pick} {p} {word} YaRN {y}"

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
                           "slack": self.choice.slack, "chunk_size": self.chunk, "local_size": self.local},
                "heldout": cells(self.heldout), "verdict": self.verdict,
                "copy": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self.copy).items()},
                "notes": self.notes, "plot": str(self.plot_path) if self.plot_path else None,
                "seconds": round(self.seconds, 1)}


class _Runner:
    """One calibration: the servers, the tokenized texts (once per text), the trial records."""

    def __init__(self, opts: Options, info: GgufInfo, work: Path, hooks: Hooks, ppl_exe: Path | None) -> None:
        self.opts, self.info, self.work, self.hooks, self.ppl_exe = opts, info, work, hooks, ppl_exe
        self.logs = work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)   # a run's logs are numbered; a later run writes over them
        self.trials_path = work / "trials.jsonl"
        self.trials_path.write_text("")
        self.corpora: dict[str, longctx.TokenizedCorpus] = {}
        self.corpus_chars: dict[str, int] = {}
        self.frame: longctx.Frame | None = None
        self.n_log = 0

    def step(self, msg: str) -> None:
        if self.hooks.on_step:
            self.hooks.on_step(msg)

    def log(self, what: str) -> Path:
        self.n_log += 1
        return self.logs / f"{self.n_log:03d}-{re.sub(r'[^A-Za-z0-9._-]+', '_', what)[:60]}.log"

    def corpus(self, srv: LlamaServer, text: Text, longest: int) -> longctx.TokenizedCorpus:
        if text.name not in self.corpora:
            chars = max(MIN_TEXT_CHARS, TEXT_CHARS_PER_TOKEN * longest)
            self.step(f"tokenize {text.name} ({min(chars, len(text.text))} characters)")
            tok = self._tok(srv, special=False)
            self.corpora[text.name] = longctx.TokenizedCorpus.build(text.name, text.text[:chars], tok)
            self.corpus_chars[text.name] = len(text.text[:chars])
        return self.corpora[text.name]

    def chars_per_token(self, name: str) -> float:
        return self.corpus_chars[name] / max(1, self.corpora[name].total)

    @staticmethod
    def _tok(srv: LlamaServer, special: bool) -> Callable[[str], list[int]]:
        def tok(s: str) -> list[int]:
            return list(srv.post("/tokenize", {"content": s, "add_special": special, "parse_special": False})["tokens"])
        return tok

    def cell(self, set_name: str, seed: int, method: str, length: int, n: int, text: Text, longest: int) -> longctx.Score:
        """``n`` trials of (set, length) through one llama-server running ``method``."""
        L, arch = self.info.trained, self.info.arch
        ctx = longctx.ctx_for(length)
        args = ["-m", str(self.opts.model.resolve()), "-c", str(ctx), "-np", "1", "--no-warmup", "--cache-ram", "0", "--no-webui",
                *self.opts.server_args, *longctx.method_args(method, ctx, L, arch)]
        self.step(f"{set_name}: {method} at {length} tokens")
        score = longctx.Score()
        srv = LlamaServer(self.opts.server, args, self.log(f"{set_name}-{method}-{length}"),
                          load_timeout=self.opts.load_timeout)
        try:
            srv.start()
            corpus = self.corpus(srv, text, longest)
            if self.frame is None:
                self.frame = longctx.Frame.build(self._tok(srv, True), self._tok(srv, False))
            tok = self._tok(srv, False)
            for t in longctx.trials(set_name, seed, length, n):
                needle = tok(longctx.NEEDLE.format(key=t.key))
                toks = longctx.prompt_tokens(t, corpus, self.frame, needle)
                t0 = time.monotonic()
                rec: dict[str, Any] = {"set": set_name, "method": method, "length": length, "index": t.index,
                                       "key": t.key, "depth": round(longctx.needle_depth(t, toks, needle), 4)}
                try:
                    answer = str(srv.completion(toks, longctx.N_PREDICT).get("content", ""))
                    rec.update(answer=answer, ok=longctx.passed(t.key, answer))
                except HttpError as exc:   # a request the server refused: a miss, with the reason
                    rec.update(answer="", ok=False, error=str(exc)[:300])
                rec["seconds"] = round(time.monotonic() - t0, 2)
                score.add(bool(rec["ok"]))
                with open(self.trials_path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec, sort_keys=True) + "\n")
                if self.hooks.on_trial:
                    self.hooks.on_trial(rec)
        except GateError as exc:   # the server did not start, or died: its log says why
            raise CalibrateError(f"{set_name} {method} at {length} tokens: {exc.message}", where=exc.where,
                                 details=exc.details, hint="read the server's log; a context this long may not fit "
                                 "the GPU's memory (lower --max-tokens), or --server-args has an option llama-server "
                                 "does not take") from None
        finally:
            srv.stop()
        return score

    def perplexity(self, method: str, ctx: int, text_file: Path) -> float | None:
        assert self.ppl_exe is not None
        argv = [str(self.ppl_exe.resolve()), "-m", str(self.opts.model.resolve()), "-f", str(text_file.resolve()),
                "-c", str(ctx), "-b", str(min(ctx, 2048)),
                *self.opts.server_args, *longctx.method_args(method, ctx, self.info.trained)]
        self.step(f"dev perplexity: {method} at {ctx}")
        value = None
        for attempt in range(3):   # llama-perplexity now and then loses its output's tail (gate.py says why)
            res = run(argv, self.work, check=False)
            text = res.stdout + res.stderr
            self.log(f"ppl-{method}-{ctx}-{attempt}").write_text(f"$ {' '.join(argv)}\n# exit {res.returncode}\n{text}")
            value = parse_perplexity(text) or last_chunk_perplexity(text)
            if value is not None or res.returncode != 0 or "you need at least" in text:
                break
        return value


def last_chunk_perplexity(text: str) -> float | None:
    """The last running estimate ``[N]value`` of llama-perplexity: the final one when every chunk was printed but
    the "Final estimate" line was lost."""
    vals = re.findall(r"\[(\d+)\]([0-9]+\.[0-9]+)", text)
    return float(vals[-1][1]) if vals else None


def preflight(model: Path, out: Path | None, force: bool, server: Path, server_from: str = "--server",
              work: Path | None = None) -> tuple[GgufInfo, Path, Path]:
    """The checks that need no text (the model, the output, the work folder, the server), before anything runs:
    (what the model is, the output, the work folder)."""
    info = inspect_gguf(model)
    out = out or default_out(model)
    check_output(model, out, force)
    work = work or default_work(out)
    if work.exists() and not work.is_dir():
        raise CalibrateError(f"the work folder {work} is a file", where=str(work), hint="give another with --work")
    check_server(server, server_from)
    return info, out, work


def calibrate(opts: Options, hooks: Hooks | None = None) -> Report:
    """``dcaforge calibrate`` (see the module): checks, the dev sweep, the pick, the held-out check, the copy."""
    hooks = hooks or Hooks()
    t_start = time.monotonic()
    info, out, work = preflight(opts.model, opts.out, opts.force, opts.server, opts.server_from, opts.work)
    for t in (opts.dev, opts.heldout):
        if len(t.text.strip()) < 1000:
            raise CalibrateError(f"the text {t.name} is too short ({len(t.text)} characters; give at least 1000)",
                                 where=t.name)
    if longctx.sha256_text(opts.dev.text) == longctx.sha256_text(opts.heldout.text):
        raise CalibrateError("the dev and held-out texts are the same: the held-out check must use another text",
                             where=opts.heldout.name, hint="give another --heldout-text")
    notes: list[str] = []
    ppl_exe = opts.perplexity if opts.perplexity is not None and opts.perplexity.is_file() else None
    if opts.perplexity is not None and ppl_exe is None:
        notes.append(f"no llama-perplexity at {opts.perplexity}: the dev perplexity was not measured")
    pl = plan(info, chunks=opts.chunks, dev_trials=opts.dev_trials, heldout_trials=opts.heldout_trials,
              max_tokens=opts.max_tokens, perplexity=ppl_exe is not None)
    if hooks.on_plan:
        hooks.on_plan(pl)
    work.mkdir(parents=True, exist_ok=True)
    r = _Runner(opts, info, work, hooks, ppl_exe)

    # dev: every candidate at every dev length, then (when llama-perplexity is there) its dev perplexity
    dev: dict[str, dict[int, longctx.Score]] = {}
    for m in pl.candidates:
        for n in pl.dev_lengths:
            dev.setdefault(m, {})[n] = r.cell(DEV_SET, DEV_SEED, m, n, pl.dev_trials, opts.dev, max(pl.dev_lengths))
    ppl: dict[str, float | None] = {m: None for m in pl.candidates}
    if pl.ppl_ctx:
        # two windows of the context, in characters at the dev text's own characters per token
        need = int(2.3 * pl.ppl_ctx * r.chars_per_token(opts.dev.name)) + 1000
        if len(opts.dev.text) < need:
            notes.append(f"the dev text ({len(opts.dev.text)} characters) is too short for two windows of {pl.ppl_ctx} "
                         "tokens: the dev perplexity was not measured")
        else:
            text_file = work / "ppl-dev.txt"
            text_file.write_text(opts.dev.text[:need], encoding="utf-8")
            for m in pl.candidates:
                ppl[m] = r.perplexity(m, pl.ppl_ctx, text_file)
            if all(v is None for v in ppl.values()):
                notes.append("llama-perplexity gave no result (see the logs): the pick used the answers alone")
    choice = longctx.choose({m: Report.total(by) for m, by in dev.items()},
                            {m: [v] for m, v in ppl.items() if v is not None}, list(pl.candidates), slack=pl.slack)
    mp = longctx.parse_method(choice.pick)
    r.step(f"pick: {choice.pick} ({choice.why})")

    # held-out: the pick beside YaRN, reported only
    heldout: dict[str, dict[int, longctx.Score]] = {choice.pick: {}, "yarn": {}}
    for m in (choice.pick, "yarn"):
        for n in pl.heldout_lengths:
            heldout[m][n] = r.cell(HELDOUT_SET, HELDOUT_SEED, m, n, pl.heldout_trials, opts.heldout, max(pl.heldout_lengths))

    r.step(f"write {out} (chunk_size {mp.chunk}, local_size {mp.local})")
    check_output(opts.model, out, opts.force)   # again: a file may have appeared there during the sweep
    copy = write_dca_copy(opts.model, out, mp.chunk, mp.local)
    rep = Report(model=opts.model, out=out, work=work, info=info, plan=pl, dev=dev, ppl=ppl, choice=choice,
                 chunk=mp.chunk, local=mp.local, heldout=heldout, copy=copy, notes=notes)
    if Report.total(heldout[choice.pick]).k < Report.total(heldout["yarn"]).k:
        notes.append("the pick scored below YaRN on the held-out trials: DCA past L is not better than YaRN on this "
                     "model at these lengths")
    from dcaforge.gate.plot import plot_calibration

    rep.plot_path = plot_calibration(rep, work / "sweep.png", r.step)
    rep.seconds = time.monotonic() - t_start
    rep.json_path = work / "report.json"
    rep.json_path.write_text(json.dumps(rep.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return rep
