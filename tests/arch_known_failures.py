"""Reviewed known failures of the generic sweep (placeholder)."""
KNOWN_FAILURES: dict[str, str] = {}
