"""The gate wing (docs/development.md, "The wings")."""
