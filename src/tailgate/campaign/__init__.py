"""Campaigns: one system under test measured at every layer, kept as documents, compared as one
table (spec: the campaign file; run: the steps; table: the before/after rows)."""
