"""Node agent: registers its node, heartbeats, and runs job members (Temporal worker on node-<id>)."""
