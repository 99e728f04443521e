"""The polyhedral middle end: scop extraction, scheduling, mapping (issue 3)."""
