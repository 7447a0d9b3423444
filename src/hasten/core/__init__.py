"""Foundations every other part uses: errors, enums, constants, environment parsing, dtype tables, nested-structure
helpers, availability probes."""
