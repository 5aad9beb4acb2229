"""Placement: a pure core (``scheduler.core``) and the service around it."""
