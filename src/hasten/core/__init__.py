"""Foundations every other part uses: errors, enums, constants, nested-structure helpers, availability probes."""
