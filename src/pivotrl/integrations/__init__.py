"""Hooks other training engines call into (verl's custom reward function)."""
