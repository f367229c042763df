"""The gates: the long-context gates on a built tree (gate, server, ruler's tasks through dcaforge.ruler),
calibrate, tryout, their figure (plot), and gatetools (the C++ logits/embedding dumpers, tiny models).

The wing's front: the modules that code outside the wing may import (docs/development.md, "The wings");
the others are the wing's inside. tests/core/test_structure.py reads FRONT without importing anything."""

FRONT = ("gate", "calibrate", "tryout")
