"""Which patch of the series changed a file, or a line of it: read from the clean room's commits
(one per patch, each with a ``dcaforge-patch: NAME`` trailer), so a template anchor that no longer
fits is reported with the patch that moved it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dcaforge.git import git

#: The trailer naming the patch in each series commit of the clean room.
TRAILER = "dcaforge-patch"
_TRAILER_RE = re.compile(rf"^{TRAILER}: (.+)$", re.MULTILINE)


def patch_name(message: str) -> str | None:
    m = _TRAILER_RE.search(message)
    return m.group(1).strip() if m else None


@dataclass
class Attribution:
    path: str                                          # room-relative
    patches: list[str] = field(default_factory=list)   # the series patches that changed it, in order
    line: int | None = None                            # a line of the baseline file (the anchor's closest)
    line_patch: str | None = None                      # the patch that last changed that line (None: the source)

    def describe(self) -> str:
        if not self.patches:
            return f"no patch of the series changed {self.path} (its text is the source tree's)"
        out = f"the series changed {self.path} in {len(self.patches)} patch{'es' if len(self.patches) != 1 else ''}: " \
              + ", ".join(self.patches) + f" (last: {self.patches[-1]})"
        if self.line is not None:
            out += (f"; line {self.line} (the anchor's closest) was last changed by {self.line_patch}" if self.line_patch
                    else f"; line {self.line} (the anchor's closest) comes from the source tree, no patch changed it")
        return out


def attribute(room: Path, start: str, baseline: str, path: str, line: int | None = None) -> Attribution:
    """The series patches (commits ``start..baseline``) that changed ``path``, and the one that last
    changed ``line`` of it in ``baseline``."""
    res = Attribution(path=path, line=line)
    log = git(room, "log", "--reverse", "--format=%x00%B", f"{start}..{baseline}", "--", path, check=False)
    if log.ok:
        res.patches = [n for n in (patch_name(m) for m in log.stdout.split("\0") if m.strip()) if n]
    if line is not None and res.patches:
        bl = git(room, "blame", "--porcelain", "-L", f"{line},{line}", baseline, "--", path, check=False)
        sha = bl.stdout.split(" ", 1)[0] if bl.ok and bl.stdout else ""
        if re.fullmatch(r"[0-9a-f]{40,64}", sha):
            inside = git(room, "merge-base", "--is-ancestor", start, sha, check=False).ok and \
                git(room, "rev-parse", start, check=False).stdout.strip() != sha
            if inside:
                msg = git(room, "log", "-1", "--format=%B", sha, check=False).stdout
                res.line_patch = patch_name(msg)
    return res
