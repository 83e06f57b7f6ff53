"""Benchmarks of the host agent; they import no central reconciler module (an import-linter contract).

`host.py` is `gpuaas bench host` (a lab host), `images.py` is `gpuaas host
image bench`, `discovery.py` is `gpuaas bench discover`, `ingress.py` is
`gpuaas bench ingress`.
"""
