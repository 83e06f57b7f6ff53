"""JSON Schemas of the desired-state kinds and the SQL migrations (data only)."""
