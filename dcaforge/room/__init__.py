"""The room: the clean room itself (lock, tags, atomic writes), its source (git clone, sdist, tree), its start
(bootstrap steps, submodules), its trees as git sees them, and which patch changed a line (blame).

The wing's front: the modules that code outside the wing may import (docs/development.md, "The wings");
the others are the wing's inside. tests/core/test_structure.py reads FRONT without importing anything."""

FRONT = ("cleanroom", "state", "trees", "source", "start", "blame")
