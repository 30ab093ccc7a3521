"""The package's version, where every layer may read it (the bench records it with its results)."""

VERSION = "0.1.0"
