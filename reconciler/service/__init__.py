"""`gpuaas serve`: the face of the store for people and programs, and the host agents' only way in.

One process serves a JSON API for the portal (`/api/v1/...`), an operator
dashboard (server-rendered HTML, no build step), Prometheus metrics and
health checks, reading PostgreSQL in read-only transactions: the reconciler
stays the only writer of placements. It also serves the host agents
(`/api/v1/agent/...`): each reads its own plan (by watch) and writes its own
reports, as its node's identity in the database.

Modules: `reads` (the queries, plain data out), `statuscache` (the capacity
read model of `gpuaas status`, cached by database snapshot), `usages`
(GPU-hours per allocation and tenant), `api` (routes, error codes, OpenAPI),
`dashboard` (Jinja2 pages), `metrics` (a Prometheus collector that reads at
scrape time), `pool` (read-only connections, psycopg_pool), `models` (the
pydantic models of every response; the OpenAPI document), `agents` (node
tokens, plan watches, reports, heartbeats), `asgi` (the Starlette app, Host
allow-list, deadlines), `server` (uvicorn, auth, health).
"""
