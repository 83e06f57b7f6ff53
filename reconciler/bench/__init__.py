"""`gpuaas bench`'s benchmarks and the synthetic fleets they (and the race tests) run on.

Not product code: only `reconciler.cli` and tests import these (an
import-linter contract keeps product modules away).
"""
