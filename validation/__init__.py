"""Validation: datasets of real measurements and comparisons with the model (imports advisor, never the reverse)."""
