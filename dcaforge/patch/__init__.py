"""The patch wing (docs/development.md, "The wings")."""
