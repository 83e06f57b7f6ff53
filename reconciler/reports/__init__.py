"""Read models: the documents the CLI prints and the service serves, built once.

Modules (import the module, call through it):
  status   the status document: capacity, nodes, allocations (`gpuaas status`, the service's capacity)
  history  reconciliations newest first, and one allocation's lifecycle (`gpuaas history`, /api/v1/history)
  summary  what a desired state offers before any claim exists (`gpuaas validate`)

Each document is plain data (JSON-ready); rendering it as text is the
command's job. The CLI and the service import the same builder, so
`gpuaas ... -o json` and the API cannot drift apart.
"""
