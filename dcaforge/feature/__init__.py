"""The feature: the manifest, rendering the templates into a tree (and the rendered files' wiring into
the build scripts, shellscan), drift against a new upstream, templatize (the room back into templates)
and capture's bookkeeping rows (Jinja lines rendered in the sandbox).

The wing's front: the modules that code outside the wing may import (docs/development.md, "The wings");
the others are the wing's inside. tests/core/test_structure.py reads FRONT without importing anything."""

FRONT = ("render", "plan", "manifest", "wiring", "drift", "templatize", "bookkeeping")
