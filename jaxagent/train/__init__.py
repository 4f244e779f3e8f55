"""See DESIGN.md for what this package holds."""
