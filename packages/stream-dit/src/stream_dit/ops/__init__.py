"""Fused operations of the runtime's tick."""
