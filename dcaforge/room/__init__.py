"""The room wing (docs/development.md, "The wings")."""
