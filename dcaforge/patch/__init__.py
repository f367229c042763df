"""The patch: the numbered series applied in the room, capture (the room as one patch), verify (the round
trip) and status (where the room and its series stand).

The wing's front: the modules that code outside the wing may import (docs/development.md, "The wings");
the others are the wing's inside. tests/core/test_structure.py reads FRONT without importing anything."""

FRONT = ("series", "capture", "verify", "status")
