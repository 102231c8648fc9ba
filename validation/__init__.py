"""Validation: datasets of real measurements, microbenchmarks, and comparisons with the model (imports advisor, never the reverse)."""
