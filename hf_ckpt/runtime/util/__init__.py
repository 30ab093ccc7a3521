"""Small helpers of every layer: units, dtypes, warnings, lazy names, RNG, storages, FLOPs, capabilities."""
