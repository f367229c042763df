"""The build: cmake / llamafile make / the GPU script in the room, and their dry run.

The wing's front: the modules that code outside the wing may import (docs/development.md, "The wings");
the others are the wing's inside. tests/core/test_structure.py reads FRONT without importing anything."""

FRONT = ("build",)
