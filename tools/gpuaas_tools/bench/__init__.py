"""`gpuaas bench`'s benchmarks and the synthetic fleets they (and the race tests) run on.

`command.py` registers `gpuaas bench` (the `bench` entry point of the
`gpuaas.commands` group); the host agent's benchmarks live in
`gpuaas_tools.hostbench`.
"""
