"""A stack that calls its blocks itself: what its code can call, blocks it calls directly, wrapped forwards."""
