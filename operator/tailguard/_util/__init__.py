"""Leaf helpers that every room may use; they import nothing from ``tailguard``."""
