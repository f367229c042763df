"""Hostile feature folders: Jinja sandbox escapes in templates, edit texts and when: expressions,
resource bombs, includes out of the folder, tree.* paths out of the tree, manifest paths under .git
or out of the tree (directly or through a symlink the source committed), and anchors that match
nowhere or twice (exit 3)."""

from __future__ import annotations

import os
import textwrap

import pytest

from .conftest import Arena

ESCAPES = [
    ("cycler-globals", "{{ cycler.__init__.__globals__.os.system('touch RAN') }}", "unsafe"),
    ("subclasses", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    ("lipsum-globals", "{{ lipsum.__globals__['os'].system('touch RAN') }}", "unsafe"),
    ("self-context", "{{ self._TemplateReference__context }}", "unsafe"),
    ("namespace-init", "{{ namespace.__init__.__globals__ }}", "unsafe"),
    ("joiner-init", "{{ joiner.__init__.__globals__ }}", "unsafe"),
    ("tree-private", "{{ tree._tree.repo }}", "unsafe"),
    ("vars-class", "{{ vars.__class__.__base__ }}", "unsafe"),
    ("format-attr", "{{ '{0.__class__}'.format(vars) }}", "unsafe"),
    ("dict-update", "{{ vars.update({'chunk': 1}) }}", "unsafe"),
    ("list-append", "{% set l = [1] %}{{ l.append(2) }}", "unsafe"),
    ("range-bomb", "{% for i in range(10**9) %}{% endfor %}", "larger than a template may use"),
    ("string-bomb", "{{ 'x' * 10**9 }}", "larger than a render may be"),
    ("power-bomb", "{{ 10 ** 10000000 }}", "larger than a template may compute"),
    ("width-bomb", "{{ 'x'|center(999999999) }}", "larger than a template may use"),
    ("include-dotdot", "{% include '../../../canary/secret.txt' %}", "template error"),
    ("include-abs", "{% include '/etc/passwd' %}", "template error"),
    ("tree-has-out", "{{ tree.has('../../canary/secret.txt') }}", "leaves the tree"),
    ("tree-contains-abs", "{{ tree.contains('/etc/passwd', 'root') }}", "is an absolute path"),
    ("tree-text-dotgit", "{{ tree.text('.git/config') }}", "is under .git/"),
    ("undefined", "{{ nope }}", "'nope' is undefined"),
]


@pytest.mark.parametrize(("source", "what"), [pytest.param(s, w, id=i) for i, s, w in ESCAPES])
def test_sandbox_in_template_files(arena: Arena, source: str, what: str) -> None:
    (arena.feature / "src" / "llama-dca.cpp.j2").write_text(source.replace("touch RAN", arena.payload))
    arena.run("apply", code=1, what=what, where="llama-dca.cpp.j2")


@pytest.mark.parametrize(("source", "what"), [pytest.param(s, w, id=i) for i, s, w in ESCAPES[:8]])
def test_sandbox_in_edit_texts(arena: Arena, source: str, what: str) -> None:
    arena.manifest(textwrap.dedent(f"""\
        edits:
          - file: CMakeLists.txt
            anchor: '(?m)^add_library'
            action: insert_before
            text: "{source.replace('touch RAN', arena.payload)}"
        """))
    arena.run("apply", code=1, what=what, where="manifest.yaml:2 (edits[0].text)")


@pytest.mark.parametrize("when", ["cycler.__init__.__globals__.os.system('touch RAN')",
                                  "tree.has('../../canary/secret.txt')", "tree.contains('.git/config', 'core')",
                                  "range(10**9) | list | length"])
def test_sandbox_in_when(arena: Arena, when: str) -> None:
    arena.manifest(textwrap.dedent(f"""\
        edits:
          - file: CMakeLists.txt
            when: "{when.replace('touch RAN', arena.payload)}"
            anchor: '(?m)^add_library'
            action: insert_before
            text: "x\\n"
        """))
    arena.run("apply", code=1, what="when:", where="manifest.yaml:2 (edits[0].when)")


def test_include_through_a_symlink_out_of_the_feature_folder(arena: Arena) -> None:
    os.symlink(arena.canary / "secret.txt", arena.feature / "src" / "secret.j2")
    (arena.feature / "src" / "llama-dca.cpp.j2").write_text("{% include 'src/secret.j2' %}")
    arena.run("apply", code=1, what="outside the feature folder")


def test_template_file_that_is_a_symlink_out_of_the_folder(arena: Arena) -> None:
    (arena.feature / "src" / "llama-dca.cpp.j2").unlink()
    os.symlink(arena.canary / "secret.txt", arena.feature / "src" / "llama-dca.cpp.j2")
    arena.run("apply", code=1, what="leads out of the feature folder", where="manifest.yaml:2")


def test_vars_are_data_not_templates(arena: Arena) -> None:
    text = arena.config_path.read_text().replace("    chunk: 8192", "    chunk: \"{{ cycler.__init__.__globals__ }}\"")
    arena.config_path.write_text(text)
    arena.run("apply", code=0)
    assert "{{ cycler.__init__.__globals__ }}" in (arena.room / "src/llama-dca.cpp").read_text()


MANIFEST_PATHS = [
    ("dest-dotgit", "files:\n  - template: src/llama-dca.cpp.j2\n    dest: .git/hooks/pre-commit\n", "is under .git/"),
    ("dest-dotgit-upper", "files:\n  - template: src/llama-dca.cpp.j2\n    dest: src/.GIT/x\n", "is under .git/"),
    ("dest-dotdot", "files:\n  - template: src/llama-dca.cpp.j2\n    dest: ../../canary/x\n", "leaves the tree"),
    ("dest-abs", "files:\n  - template: src/llama-dca.cpp.j2\n    dest: /tmp/x\n", "is an absolute path"),
    ("template-dotdot", "files:\n  - template: ../../../canary/secret.txt\n    dest: x\n", "must be a relative path inside the feature folder"),
    ("edit-file-dotgit", "edits:\n  - file: .git/config\n    anchor: core\n    action: replace\n    text: x\n",
     "is under .git/"),
    ("edit-file-list-dotdot", "edits:\n  - file: [src/llama.cpp, ../x]\n    anchor: a\n    action: replace\n"
                              "    text: x\n", "leaves the tree"),
    ("when-exists-out", "edits:\n  - file: src/llama.cpp\n    when_exists: ../../canary/secret.txt\n    anchor: a\n"
                        "    action: replace\n    text: x\n", "leaves the tree"),
    ("bad-regex", "edits:\n  - file: src/llama.cpp\n    anchor: '(unclosed'\n    action: replace\n    text: x\n",
     "is not a valid regex"),
    ("bad-action", "edits:\n  - file: src/llama.cpp\n    anchor: a\n    action: exec\n    text: x\n", "must be one of"),
]


@pytest.mark.parametrize(("manifest", "what"), [pytest.param(m, w, id=i) for i, m, w in MANIFEST_PATHS])
def test_manifest_paths_stay_in_the_tree(arena: Arena, manifest: str, what: str) -> None:
    arena.manifest(manifest)
    arena.run("apply", code=1, what=what, where="manifest.yaml:")


def test_dest_through_a_symlink_the_source_committed(arena: Arena) -> None:
    arena.symlink_in_source("out", str(arena.canary))
    arena.manifest("files:\n  - template: src/llama-dca.cpp.j2\n    dest: out/planted.cpp\n")
    arena.run("apply", code=1, what="outside the clean room", next="nothing was written")
    assert not (arena.canary / "planted.cpp").exists()


def test_edit_of_a_symlink_the_source_committed(arena: Arena) -> None:
    arena.symlink_in_source("secret-link", str(arena.canary / "secret.txt"))
    arena.manifest("edits:\n  - file: secret-link\n    anchor: canary\n    action: replace\n    text: x\n")
    arena.run("apply", code=1, what="outside the clean room")
    assert (arena.canary / "secret.txt").read_text() == "the user's secret\n"


def test_dest_onto_an_existing_symlink_to_a_file_outside(arena: Arena) -> None:
    arena.symlink_in_source("src/llama-dca.cpp", str(arena.canary / "keep.txt"))
    arena.run("apply", code=1, what="outside the clean room")
    assert (arena.canary / "keep.txt").read_text() == "keep me\n"


@pytest.mark.parametrize(("anchor", "what"), [("int line_0999 = 999;", "anchor matches nowhere"),
                                              ("int line_00", "matches 9 times, expected 1")])
def test_anchors_that_do_not_fit_exit_3(arena: Arena, anchor: str, what: str) -> None:
    arena.manifest(f"edits:\n  - file: src/llama.cpp\n    anchor: '{anchor}'\n    action: replace\n    text: x\n")
    arena.run("apply", code=3, what=what, where="manifest.yaml:2 -> src/llama.cpp", next="render --check")
    out = arena.run("render", "--check", code=3, what="do not fit")
    assert "Traceback" not in out.output
