"""The relational store: the fleet's source of truth (SQLite or PostgreSQL)."""
