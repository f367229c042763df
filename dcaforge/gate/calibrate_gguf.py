"""``dcaforge calibrate``'s GGUF work: what a model file is (:func:`inspect_gguf`: a GGUF that reads whole, an
architecture and an attention DCA serves, its trained length L) and the copy with DCA's sizes (:func:`write_dca_copy`,
checked by :func:`verify_copy`), through gguf-py (the ``gguf`` package)."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcaforge.errors import CalibrateError

#: the architectures 0078 serves (templates/dca/files/src/llama-dca.cpp.j2, llama_dca_arch_supported)
SUPPORTED_ARCHS = ("gemma4", "gemma3", "qwen2", "qwen3", "qwen3moe", "llama")
KEY_CHUNK = "{arch}.attention.dual_chunk.chunk_size"
KEY_LOCAL = "{arch}.attention.dual_chunk.local_size"
KEY_DCA_ORIG = "{arch}.attention.dual_chunk.original_context_length"
#: the model's own attention temperature, "pos", "chunk", "len" or "off" (a string): 0078 reads it when --dca-yarn-factor is left at its
#: default (model)
KEY_TEMPERATURE = "{arch}.attention.dual_chunk.temperature"
TEMPERATURES = ("off", "pos", "chunk", "len")
KEY_ROPE_ORIG = "{arch}.rope.scaling.original_context_length"
KEY_CTX = "{arch}.context_length"


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



@dataclass(frozen=True)
class CopyResult:
    path: Path
    chunk: int
    local: int
    n_kv: int
    n_tensors: int
    tensor_bytes: int
    temperature: str = "off"


def write_dca_copy(src: Path, dst: Path, chunk: int, local: int, temperature: str = "off") -> CopyResult:
    """Write ``dst``: ``src`` with ``<arch>.attention.dual_chunk.chunk_size = chunk`` and ``.local_size = local``
    (uint32) and ``.temperature`` (a string, ``off``, ``len``, ``pos`` or ``chunk``: written either way, so that a copy of a copy says
    what its own calibration chose), every other key, every tensor and the alignment as they were; checked by reading ``dst`` back (the
    keys, the values, every tensor's bytes), through a temporary file beside ``dst`` that an error or an interrupt
    removes. ``src`` is only read."""
    import gguf

    if chunk <= 0 or local <= 0 or local >= chunk:
        raise ValueError(f"chunk {chunk}, local {local}: need 0 < local < chunk")
    if temperature not in TEMPERATURES:
        raise ValueError(f"temperature {temperature!r}: need one of {', '.join(TEMPERATURES)}")
    reader = _read(src)
    kv = _fields(reader)
    arch = str(kv["general.architecture"])
    new: dict[str, int | str] = {KEY_CHUNK.format(arch=arch): chunk, KEY_LOCAL.format(arch=arch): local,
                                 KEY_TEMPERATURE.format(arch=arch): temperature}
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
            writer.add_key_value(key, value, gguf.GGUFValueType.STRING if isinstance(value, str) else gguf.GGUFValueType.UINT32)
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
    return CopyResult(dst, chunk, local, res[0], res[1], res[2], temperature)


def verify_copy(src: Path, dst: Path, new: dict[str, int | str]) -> tuple[int, int, int]:
    """(keys, tensors, tensor bytes) of ``dst`` once it is checked against ``src``: the same keys and values but
    ``new`` (uint32 there, or a string for a str), the same tensors (name, type, shape, bytes) in the same order. CalibrateError otherwise."""
    import gguf

    a, b = _read(src), _read(dst)
    ka, kb = _fields(a), _fields(b)
    want = {**{k: v for k, v in ka.items() if k not in new}, **new}
    bad = sorted(k for k in set(want) | set(kb) if want.get(k) != kb.get(k))
    for k in new:
        fld = b.fields.get(k)
        want_type = gguf.GGUFValueType.STRING if isinstance(new[k], str) else gguf.GGUFValueType.UINT32
        if fld is None or fld.types != [want_type]:
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
