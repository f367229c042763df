"""Consent: commands a config declares run only from a config the user trusts.

A config's ``bootstrap:`` shell and argv steps are commands by design (and so is downloading a
``source.pypi`` sdist that is not cached yet: pip runs the package's build backend to read its
metadata), and a config is often someone else's (a colleague's, another repository's). Like copier's ``--trust``, dcaforge runs them
only when the user says so: ``dcaforge apply --trust``, or the config is listed in the user's
settings file (:func:`settings_path`, e.g. ``~/.config/dcaforge/settings.yaml``)::

    trusted:
      - /home/me/work/llamafile/dcaforge.yaml   # this config file
      - /home/me/work/                          # every config under this folder (a trailing /)
      - ~/src/dcaforge/examples/                # ~ is your home

There is no environment variable that trusts a config, and trust never comes from a relative
settings path: a relative ``XDG_CONFIG_HOME`` is ignored (as the XDG spec says), and so is a
relative ``HOME`` (either would make the folder the user stands in, a checkout, the one that trusts). ``bootstrap: {patches: FOLDER}`` steps are
not commands (dcaforge applies those patches itself, confined like the series) and need no trust.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dcaforge import guard
from dcaforge.config import BUILTIN_CONFIG, Config, PypiSource, parse_config
from dcaforge.configsections import BootstrapStep
from dcaforge.errors import ConfigError, DcaforgeError
from dcaforge.yamlio import Reader, load_yaml

#: A config declares commands and is not trusted (the refusal of :func:`dcaforge.guard.require_consent`).
TrustError = guard.ConsentError


def settings_path() -> Path | None:
    """``$XDG_CONFIG_HOME/dcaforge/settings.yaml``, else ``~/.config/dcaforge/settings.yaml``; a
    relative ``XDG_CONFIG_HOME`` is ignored (the XDG spec: such a value is invalid), and with a
    relative ``HOME`` there is no settings file (None): trust never comes from the current folder."""
    xdg = os.environ.get("XDG_CONFIG_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "dcaforge" / "settings.yaml"
    try:
        home = Path.home()
    except (KeyError, RuntimeError):
        return None
    return home / ".config" / "dcaforge" / "settings.yaml" if home.is_absolute() else None


def settings_label() -> str:
    """The settings file's path, for messages (also when there is none)."""
    path = settings_path()
    return str(path) if path is not None else "~/.config/dcaforge/settings.yaml (with HOME set to an absolute path)"


def trusted_entries(path: Path | None = None) -> list[str]:
    """The ``trusted:`` list of the settings file (none when there is no file)."""
    path = path or settings_path()
    if path is None or not os.path.exists(path):  # (a folder that cannot be entered: no file either)
        return []
    top = Reader(load_yaml(path), str(path))
    top.check_keys({"trusted"})
    items = top.get("trusted", list, default=[])
    lines = top.list_lines("trusted")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"'trusted[{i}]' must be the path of a config file or of a folder (ending with /)",
                              where=f"{path}:{lines[i] if i < len(lines) else top.line}",
                              hint="e.g. trusted: [/home/me/work/dcaforge.yaml, /home/me/work/]")
        out.append(item.strip())
    return out


def _matches(config: Path, entry: str) -> bool:
    folder = entry.endswith("/")
    p = Path(os.path.expanduser(entry))
    if not p.is_absolute():
        return False  # a relative entry would trust whatever folder the user stands in
    real = Path(os.path.realpath(p))
    if folder:
        return real in config.parents
    return real == config


@dataclass(frozen=True)
class Trust:
    trusted: bool
    why: str  # "--trust", "settings.yaml: <entry>", "the built-in default", or "" when not trusted


def trust_of(cfg: Config, flag: bool) -> Trust:
    if flag:
        return Trust(True, "--trust")
    if cfg.path is None:
        return Trust(False, "")
    config = Path(os.path.realpath(cfg.path))
    if config == Path(os.path.realpath(BUILTIN_CONFIG)):
        return Trust(True, "the built-in default")
    for entry in trusted_entries():
        if _matches(config, entry):
            return Trust(True, f"{settings_label()}: {entry}")
    return Trust(False, "")


def commands(cfg: Config) -> list[BootstrapStep]:
    """The steps of the config that run commands (shell strings and argv lists)."""
    return [s for s in cfg.bootstrap if s.shell is not None or s.argv is not None]


def full_text(step: BootstrapStep) -> str:
    if step.shell is not None:
        return step.shell.strip()
    return " ".join(step.argv or ())


def require(cfg: Config, flag: bool) -> Trust | None:
    """None when the config declares no command; its Trust when it does and is trusted; else a
    TrustError that shows the commands and says how to trust the config."""
    steps = commands(cfg)
    if not steps:
        return None
    t = trust_of(cfg, flag)
    if t.trusted:
        return t
    shown = "\n".join(f"{s.where}:\n" + "\n".join("      " + ln for ln in full_text(s).splitlines()) for s in steps)
    guard.require_consent(
        False,
        f"{cfg.describe()} declares {len(steps)} command{'s' if len(steps) != 1 else ''} to run in the clean room "
        "(bootstrap:), and dcaforge runs a config's commands only when you trust it; nothing was run or made",
        where=f"{cfg.describe()} (bootstrap:)", details=shown,
        hint=f"read them; if you trust them, run `dcaforge apply --trust`, or add the config (or its "
             f"folder, ending with /) to 'trusted:' in {settings_label()}")
    return None  # not reached


def require_download(cfg: Config, flag: bool, requirement: str, cache: Path) -> None:
    """pip prepares a downloaded sdist's metadata by running the package's build backend: that is a
    command too, run only for a trusted config, or for the requirement the built-in default names
    (``cache``: the folder where the sdist, put there by hand, is used without a download)."""
    guard.require_consent(
        trust_of(cfg, flag).trusted or requirement == _builtin_requirement(),
        f"{cfg.describe()} asks for the sdist {requirement}, which is not in dcaforge's cache; downloading it runs "
        "its build backend (pip prepares an sdist's metadata with the package's own code), and dcaforge runs a "
        "config's commands only when you trust it; nothing was downloaded or made",
        where=f"{cfg.describe()} (source.pypi)",
        hint=f"if you trust the package, run `dcaforge apply --trust` (or list the config in "
             f"{settings_label()}), or put its sdist into {cache} yourself")


def _builtin_requirement() -> str | None:
    """The sdist dcaforge's own default names (trusted wherever a config names it too)."""
    try:
        src = parse_config(BUILTIN_CONFIG).source
    except DcaforgeError:
        return None
    return src.requirement if isinstance(src, PypiSource) else None
