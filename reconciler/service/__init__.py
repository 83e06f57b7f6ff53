"""`gpuaas serve`: the read-only face of the store for people and programs.

One process serves a JSON API for the portal (`/api/v1/...`), an operator
dashboard (server-rendered HTML, no build step), Prometheus metrics and
health checks. It reads PostgreSQL in read-only transactions and never
writes: the reconciler stays the only writer of placements.

Modules: `reads` (the queries, plain data out), `capacities` (the capacity
read model of `gpuaas status`, cached by database snapshot), `usages`
(GPU-hours per allocation and tenant), `api` (routes, error codes, OpenAPI),
`dashboard` (Jinja2 pages), `metrics` (a Prometheus collector that reads at
scrape time), `pool` (read-only connections), `server` (HTTP, auth, health).
"""
