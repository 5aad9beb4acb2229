"""fairgang: a fair, gang-scheduling platform for a shared GPU fleet."""

__version__ = "0.1.0"
