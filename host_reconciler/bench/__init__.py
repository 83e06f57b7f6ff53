"""Benchmarks of the host agent, apart from product code (an import-linter contract).

`host.py` is `gpuaas bench host` (a lab host), `images.py` is `gpuaas host
image bench`, `discovery.py` is `gpuaas bench discover`.
"""
