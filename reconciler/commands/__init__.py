"""Subcommands of `gpuaas`; one module per group."""
