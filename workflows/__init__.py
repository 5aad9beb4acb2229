"""Durable Temporal workflows: one per job (deterministic code only)."""
