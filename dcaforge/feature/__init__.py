"""The feature wing (docs/development.md, "The wings")."""
