"""gpuaas-tools: the benchmarks, the demo and the labs, apart from the product.

`gpuaas bench ...`, `gpuaas demo` and `gpuaas host image bench` come from
here; the product finds them through the `gpuaas.commands` entry points
(schemas/plugins.py) and never imports this package (an import-linter
contract). `bench/` holds the central benchmarks and the synthetic fleets,
`hostbench/` the host agent's, `demo/` the demo and the example fleet it
ships, `lab/` the stand-ins they run against (a lab host, a standalone
Ironic, a MAAS simulator, an SSH stand-in).
"""
