"""`gpuaas demo`'s parts: the claims, GitOps and host stories told on an example fleet.

Not product code: only `reconciler.commands.demo` and tests import these
(an import-linter contract keeps product modules away).
"""
