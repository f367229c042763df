"""Hostile configs: YAML bombs and tricks (each reported as file:line:col with the next step), wrong
types and unknown keys, paths out of the tree, workspaces in the user's repositories, commands that
run only by consent (--trust, or the settings file), and settings files that are hostile too."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from .conftest import Arena

LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ",".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8))


def yaml_case(arena: Arena, text: str | bytes) -> Path:
    path = arena.work / "hostile.yaml"
    path.write_bytes(text.encode("utf-8", "surrogateescape") if isinstance(text, str) else text)
    return path


YAML_CASES = [
    ("billion-laughs", LAUGHS, "billion laughs", ":6:"),
    ("recursive-alias", "name: &x [*x]\n", "a recursive alias", ":1:7"),
    ("recursive-mapping", "source: &s {git: *s}\n", "a recursive alias", ":1:9"),
    ("python-tag", "name: !!python/object/apply:os.system ['touch RAN']\n", "unknown tag", ":1:7"),
    ("python-tag-scalar", "name: !!python/name:os.system x\n", "cannot read this value", ":1:7"),
    ("custom-tag-mapping", "source: !evil {git: x}\n", "unknown tag '!evil'", ":1:9"),
    ("custom-tag-list", "bootstrap: !run [x]\n", "unknown tag '!run'", ":1:12"),
    ("undefined-alias", "name: *nope\n", "found undefined alias", ":1:7"),
    ("tab-indent", "name: x\nsource:\n\tgit: y\n", "invalid YAML", ":3:1"),
    ("control-char", "name: x\x07y\n", "invalid YAML", ":1:8"),
    ("nested-deep", "name: " + "[" * 100 + "]" * 100 + "\n", "nest deeper than 64", ":1:"),
    ("merge-key", "base: &b {name: x}\nfeature:\n  <<: *b\n", "merge keys (<<) are not supported", ":3"),
    ("duplicate-key", "name: a\nname: b\n", "duplicate key 'name'", ":2"),
    ("huge-int", "name: " + "9" * 5000 + "\n", "cannot read this value", ":1:7"),
    ("unclosed-flow", "name: [x\n", "invalid YAML", ":2:1"),
    ("top-level-list", "- name\n", "'(top level)' must be a mapping", ":1"),
    ("empty-file", "", "missing key 'name'", "hostile.yaml"),
]


@pytest.mark.parametrize(("text", "what", "where"), [pytest.param(t, w, at, id=i) for i, t, w, at in YAML_CASES])
def test_yaml_problems_name_file_line_col(arena: Arena, text: str, what: str, where: str) -> None:
    path = yaml_case(arena, text.replace("touch RAN", arena.payload))
    out = arena.run("status", "-c", str(path), code=1, what=what, where=where)
    assert "Traceback" not in out.output


def test_non_utf8_config(arena: Arena) -> None:
    path = yaml_case(arena, b"name: room\nfeature: \xff\xfe\n")
    arena.run("status", "-c", str(path), code=1, what="not UTF-8 text (byte 0xff)", where="hostile.yaml:2:10",
              next="save the file as UTF-8")


def test_huge_config_is_not_read(arena: Arena) -> None:
    path = arena.work / "huge.yaml"
    with open(path, "wb") as fh:
        fh.truncate(20 * 1024 * 1024)
    arena.run("status", "-c", str(path), code=1, what="more than dcaforge reads as YAML")


def test_manifest_bomb(arena: Arena) -> None:
    (arena.feature / "manifest.yaml").write_text(LAUGHS)
    arena.run("apply", code=1, what="billion laughs", where="manifest.yaml:6:")


def test_manifest_python_tag(arena: Arena) -> None:
    (arena.feature / "manifest.yaml").write_text(f"files: !!python/object/apply:os.system ['{arena.payload}']\n")
    arena.run("apply", code=1, what="unknown tag", where="manifest.yaml:1:8")


def _edit_config(arena: Arena, old: str, new: str) -> None:
    text = arena.config_path.read_text()
    assert old in text, (old, text)
    arena.config_path.write_text(text.replace(old, new, 1))


SCHEMA_CASES = [
    ("name-traversal", ("name: room", "name: ../escape"), "'name' must be a plain folder name"),
    ("name-int", ("name: room", "name: 5"), "'name' must be a string"),
    ("llama-dotdot", ("llama_cpp_dir: .", "llama_cpp_dir: ../x"), "must be a relative path inside the tree"),
    ("llama-abs", ("llama_cpp_dir: .", "llama_cpp_dir: /etc"), "must be a relative path inside the tree"),
    ("llama-dotgit", ("llama_cpp_dir: .", "llama_cpp_dir: .git"), "is under .git/"),
    ("range-text", ("  dir: patches", "  dir: patches\n  range: all"), "'series.range' must look like 0001-0077"),
    ("number-negative", ("  number: 78", "  number: -1"), "'feature.number' must be between 1 and 9999"),
    ("bootstrap-int", ("series:", "bootstrap: 5\nseries:"), "'bootstrap' must be a list"),
    ("unknown-top", ("name: room", "name: room\nsauce: x"), "unknown key 'sauce'"),
    ("typo-nested", ("  dir: patches", "  dri: patches"), "did you mean 'dir'?"),
    ("bootstrap-patches-dotgit", ("series:", "bootstrap:\n  - patches: .git/hooks\nseries:"), "is under .git/"),
    ("build-dir-out", ("series:", "build:\n  cmake:\n    dir: ../../canary\nseries:"),
     "must be a relative path inside the tree"),
    ("vars-not-mapping", ("    chunk: 8192", "    - 8192"), "'feature.vars' must be a mapping"),
]


@pytest.mark.parametrize(("change", "what"), [pytest.param(c, w, id=i) for i, c, w in SCHEMA_CASES])
def test_schema_errors_name_the_key(arena: Arena, change: tuple[str, str], what: str) -> None:
    _edit_config(arena, *change)
    arena.run("apply", code=1, what=what, where=str(arena.config_path))
    assert not arena.workspace.exists() or not any(arena.workspace.iterdir())


def test_llama_cpp_dir_through_a_symlink_out_of_the_tree(arena: Arena) -> None:
    arena.symlink_in_source("llama", str(arena.canary))
    _edit_config(arena, "llama_cpp_dir: .", "llama_cpp_dir: llama")
    arena.run("apply", code=1, what="outside the clean room", where="llama_cpp_dir")
    assert sorted(p.name for p in arena.canary.iterdir()) == ["keep.txt", "secret.txt"]


@pytest.mark.parametrize("where", ["inside", "dotgit"])
def test_workspace_in_the_source_or_its_git_dir_is_refused(arena: Arena, where: str) -> None:
    target = arena.source / "rooms" if where == "inside" else arena.source / ".git" / "rooms"
    arena.write_config(cleanroom=str(target))
    arena.run("apply", code=1, what="inside the", next="cleanroom")
    assert not target.exists()
    arena.assert_source_untouched()


def test_workspace_in_a_linked_worktrees_common_git_dir_is_refused(arena: Arena) -> None:
    linked = arena.tmp / "linked"
    os.system(f"git -C {arena.source} worktree add -q {linked} HEAD >/dev/null 2>&1")
    assert (linked / ".git").is_file()
    arena.write_config(source=f"git: {linked}\nref: HEAD", cleanroom=str(arena.source / ".git" / "worktrees" / "rooms"))
    arena.run("apply", code=1, what="inside the", may_change=[arena.source / ".git", linked])
    assert not (arena.source / ".git" / "worktrees" / "rooms").exists()


# --- commands only by consent -----------------------------------------------------------------

def _bootstrap(arena: Arena, steps: str) -> None:
    arena.config_path.write_text(arena.config_path.read_text() + "bootstrap:\n" + textwrap.indent(steps, "  "))


@pytest.mark.parametrize("step", ["- {payload}\n", "- [sh, -c, '{payload}']\n", "- |\n  echo multi\n  {payload}\n"])
def test_bootstrap_commands_need_consent(arena: Arena, step: str) -> None:
    _bootstrap(arena, step.format(payload=arena.payload))
    out = arena.run("apply", code=1, what="runs a config's commands only when you trust it", where="bootstrap:",
                    next="--trust")
    assert arena.payload in out.output  # shows what would run
    assert str(Path(os.environ.get("HOME", "~")) / ".config" / "dcaforge" / "settings.yaml") in out.output
    assert not arena.workspace.exists() or not any(arena.workspace.iterdir())


def test_trust_flag_shows_and_runs_the_commands(arena: Arena) -> None:
    _bootstrap(arena, "- echo made > made.txt\n")
    out = arena.run("apply", "--trust", code=0, what="$ echo made > made.txt")
    assert "(trusted: --trust)" in out.output and (arena.room / "made.txt").read_text() == "made\n"


@pytest.mark.parametrize("entry", ["{config}", "{folder}/", "~/{rel}"])
def test_trusted_in_the_settings_file(arena: Arena, monkeypatch: pytest.MonkeyPatch, entry: str) -> None:
    _bootstrap(arena, "- echo made > made.txt\n")
    xdg = arena.tmp / "xdg"
    (xdg / "dcaforge").mkdir(parents=True)
    home = Path(os.environ["HOME"])
    link = home / "proj"
    os.symlink(arena.work, link)
    value = entry.format(config=arena.config_path, folder=arena.work, rel="proj/")
    (xdg / "dcaforge" / "settings.yaml").write_text(f"trusted:\n  - {value}\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    out = arena.run("apply", code=0, what="(trusted:")
    assert str(xdg / "dcaforge" / "settings.yaml") in out.output and (arena.room / "made.txt").is_file()


@pytest.mark.parametrize(("settings", "what"), [
    ("trusted:\n  - work/\n", "runs a config's commands only when you trust it"),  # relative: trusts nothing
    ("trusted:\n  - /elsewhere/\n", "runs a config's commands only when you trust it"),
    ("trusted: yes\n", "'trusted' must be a list"),
    ("trusted:\n  - 5\n", "'trusted[0]' must be the path of a config file"),
    ("trustd: []\n", "unknown key 'trustd'"),
    (LAUGHS, "billion laughs"),
])
def test_settings_that_do_not_trust(arena: Arena, monkeypatch: pytest.MonkeyPatch, settings: str, what: str) -> None:
    _bootstrap(arena, f"- {arena.payload}\n")
    xdg = arena.tmp / "xdg"
    (xdg / "dcaforge").mkdir(parents=True)
    (xdg / "dcaforge" / "settings.yaml").write_text(settings)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    arena.run("apply", code=1, what=what)


def test_no_environment_variable_trusts_a_config(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    _bootstrap(arena, f"- {arena.payload}\n")
    for var in ("DCAFORGE_TRUST", "DCAFORGE_TRUSTED", "TRUST"):
        monkeypatch.setenv(var, "1")
    arena.run("apply", code=1, what="only when you trust it")


def test_tree_patches_step_needs_no_trust(arena: Arena) -> None:
    arena.commit_in_source({"tree-patches/a.patch": "--- a/docs/notes.txt\n+++ b/docs/notes.txt\n@@ -1 +1 @@\n"
                                                     "-no final newline here\n\\ No newline at end of file\n+patched\n"})
    _bootstrap(arena, "- patches: tree-patches\n")
    arena.run("apply", code=0)
    assert (arena.room / "docs/notes.txt").read_text() == "patched\n"


def test_tree_patch_aimed_at_git_config_makes_nothing(arena: Arena) -> None:
    arena.commit_in_source({"tree-patches/a.patch": "--- a/.git/config\n+++ b/.git/config\n@@ -1 +1,2 @@\n [core]\n"
                                                     f"+\tfsmonitor = {arena.payload}\n"})
    _bootstrap(arena, "- patches: tree-patches\n")
    arena.run("apply", code=1, what="is under .git/", where="tree-patches/a.patch", next="the clean room was not created")
    assert not arena.room.exists()


# --- sources that are URLs with a payload --------------------------------------------------------

@pytest.mark.parametrize("url", ["ext::sh -c touch% {ran}", "ssh://-oProxyCommand=touch%20{ran}/x",
                                 "--upload-pack=touch {ran}", "file://{canary}"])
def test_source_urls_cannot_run_commands(arena: Arena, url: str) -> None:
    arena.write_config(source=f"git: '{url.format(ran=arena.ran, canary=arena.canary)}'\nref: main")
    out = arena.run("apply", code=1, what="")
    assert "error:" in out.output


# --- bookkeeping ------------------------------------------------------------------------------

def _bookkeeping(arena: Arena, file: str, row: str = "| `{{ feature.id }}` | x |") -> None:
    arena.config_path.write_text(arena.config_path.read_text() + textwrap.dedent(f"""\
        bookkeeping:
          series_readme:
            file: {file}
            row: "{row}"
        """))


def test_bookkeeping_into_the_sources_git_config_is_refused(arena: Arena) -> None:
    _bookkeeping(arena, str(arena.source / ".git" / "x.md"))
    arena.applied()
    arena.run("capture", code=1, what="inside the git directory", next="outside git directories")
    assert not (arena.patches / "0078-dca.patch").exists()


def test_bookkeeping_into_a_dotgit_folder_is_refused(arena: Arena) -> None:
    (arena.work / ".git").mkdir()
    (arena.work / ".git" / "README.md").write_text("## Current series\n| a | b |\n|---|---|\n")
    _bookkeeping(arena, ".git/README.md")
    arena.applied()
    arena.run("capture", code=1, what="inside the git directory")


@pytest.mark.parametrize("row", ["| {{ cycler.__init__.__globals__.os.system('touch RAN') }} |",
                                 "| {{ feature.__class__.__mro__[1].__subclasses__() }} |",
                                 "| {{ (feature.id ~ ' ') * 99999999 }} |"])
def test_bookkeeping_row_is_sandboxed_and_status_does_not_render_it(arena: Arena, row: str) -> None:
    (arena.work / "README.md").write_text("## Current series\n\n| patch | what |\n|---|---|\n")
    _bookkeeping(arena, "README.md", row.replace("touch RAN", arena.payload).replace('"', '\\"'))
    arena.run("status", code=0)  # the config is read, its row not rendered
    arena.applied()
    arena.run("capture", code=1, what="template error", where=str(arena.config_path))
    assert not (arena.patches / "0078-dca.patch").exists()


@pytest.mark.parametrize("req", ["--index-url=http://127.0.0.1:9/simple x", "-r /etc/passwd", "x @ file:///tmp/x.tgz",
                                 "x==1; os_name == 'posix'"])
def test_pypi_requirement_cannot_carry_pip_options_or_urls(arena: Arena, req: str) -> None:
    text = arena.config_path.read_text()
    start, end = text.index("source:\n"), text.index("llama_cpp_dir:")
    arena.config_path.write_text(text[:start] + f"source:\n  pypi: \"{req}\"\n  subdir: .\n" + text[end:])
    arena.run("apply", code=1, what="'source.pypi' must be a package name with a version", next="no pip option")
    assert not (arena.tmp / "cache").exists()


def test_an_uncached_sdist_of_an_untrusted_config_is_not_downloaded(arena: Arena, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip runs an sdist's build backend to read its metadata: the download needs consent."""
    arena.evil_index(monkeypatch)
    text = arena.config_path.read_text()
    start, end = text.index("source:\n"), text.index("llama_cpp_dir:")
    arena.config_path.write_text(text[:start] + "source:\n  pypi: evilpkg==1.0\n  subdir: .\n" + text[end:])
    arena.run("apply", code=1, what="downloading it runs its build backend", where="source.pypi", next="--trust")
    assert not any((arena.tmp / "cache").rglob("*.tar.gz")) if (arena.tmp / "cache").exists() else True
