"""Automatic schedules: the search space of MappingOptions, candidate evaluation in isolated
worker processes, a static cost model, the persistent cache, and compare."""
