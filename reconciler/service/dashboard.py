"""The operator dashboard: server-rendered HTML pages from Jinja2 templates (package data), no script, no CDN.

Pages refresh themselves (`<meta http-equiv="refresh">`). The fleet page
is where an operator acts: a search (`?q=` over node names, allocation ids
and tenants; `?tenant=` for one tenant's allocations), the failed and stuck
allocations with their reason, attempts and what the host said, and the
history with retries collapsed (reconciler.service.lookups). The fleet page
stays fast at any size: its header and the region overview are aggregate
queries, and the nodes x slots grid is one page of nodes at a time (filter
by region or by slot state, e.g. every node with drift). Capacity comes from
the capacity cache and says how old it is; it is never computed while a
page waits longer than a moment.

Autoescape is on for every template: node names, drift messages and
pending reasons are text from git and from hosts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import jinja2

from reconciler.service import api, lookups, reads, statuscache
from schemas.errors import GpuaasError

PAGE_SIZE = 100
CAPACITY_WAIT_S = 0.5


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reconciler.service", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["short"] = lambda rev: (rev or "-")[:12]
    env.filters["when"] = lambda ts: str(ts)[:19].replace("T", " ") if ts else "-"
    return env


def _one(query: Mapping[str, Sequence[str]], name: str) -> str | None:
    values = query.get(name)
    return values[-1] if values and values[-1] else None


class Dashboard:
    def __init__(self, ctx: api.Context, *, refresh_s: int = 15) -> None:
        self._ctx = ctx
        self._env = environment()
        self.refresh_s = refresh_s

    def _render(self, template: str, **values: Any) -> str:
        return self._env.get_template(template).render(refresh_s=self.refresh_s, **values)

    def _capacity(self) -> tuple[statuscache.Answer | None, str | None]:
        try:
            return self._ctx.capacity.get(wait_s=CAPACITY_WAIT_S), None
        except GpuaasError as e:
            return None, f"{e.code}: {e.message}"

    def fleet(self, query: Mapping[str, Sequence[str]]) -> str:
        region, state = _one(query, "region"), _one(query, "state")
        q, tenant = _one(query, "q"), _one(query, "tenant")
        for name, value in (("q", q), ("tenant", tenant)):
            if value is not None and len(value) > 200:
                raise api.ApiError(400, api.BAD_REQUEST, f"{name} is longer than 200 characters")
        if state is not None and state not in reads.SLOT_STATES:
            raise api.ApiError(400, api.BAD_REQUEST, f"state must be one of {', '.join(reads.SLOT_STATES)}")
        try:
            page = max(1, int(_one(query, "page") or 1))
        except ValueError:
            raise api.ApiError(400, api.BAD_REQUEST, "page must be an integer") from None
        from reconciler.store import history, lifecycle

        with self._ctx.pool.reading() as conn:
            disrupted = [r for r in lifecycle.disruption(conn) if r["disrupted"]]
            overview = reads.regions(conn)
            summary = reads.fleet_summary(conn, overview=overview)  # its slot counts summed from the overview
            grid = reads.nodes(conn, region=region, state=state, limit=PAGE_SIZE, offset=(page - 1) * PAGE_SIZE)
            pending = reads.pending(conn, limit=100)
            drift = reads.drift(conn)
            recent = lookups.collapsed(reads.history(conn, 100))  # a retry every 10 s is one row, counted
            health = history.health(conn)
            troubled = lookups.troubled(conn)
            found = lookups.search(conn, q, tenant) if q or tenant else None
        capacity, capacity_error = self._capacity()
        pages = max(1, math.ceil(grid["total"] / PAGE_SIZE))
        width = max((len(n["slots"]) for n in grid["items"]), default=0)

        def link(**changes: Any) -> str:
            params = {
                k: v
                for k, v in {"region": region, "state": state, "page": page, **changes}.items()
                if v not in (None, 1)
            }
            return "/?" + urlencode(params) if params else "/"

        return self._render(
            "fleet.html",
            summary=summary,
            overview=overview,
            grid=grid,
            width=width,
            page=page,
            pages=pages,
            region=region,
            state=state,
            link=link,
            pending=pending,
            drift=drift,
            drift_shown=drift["findings"][:100],
            recent=recent,
            health=health,
            capacity=capacity,
            capacity_error=capacity_error,
            slot_states=reads.SLOT_STATES,
            troubled=troubled,
            found=found,
            q=q,
            tenant=tenant,
            disrupted=disrupted,
        )

    def node(self, name: str) -> str:
        with self._ctx.pool.reading() as conn:
            doc = reads.node(conn, name)
        if doc is None:
            raise api.ApiError(404, api.NOT_FOUND, f"no node {name!r} in the store")
        return self._render("node.html", node=doc)

    def allocation(self, allocation_id: str) -> str:
        with self._ctx.pool.reading() as conn:
            doc = reads.allocation(conn, allocation_id)
        if doc is None:
            raise api.ApiError(404, api.NOT_FOUND, f"no allocation {allocation_id!r} in the store")
        return self._render("allocation.html", a=doc)

    def error(self, status: int, code: str, message: str) -> str:
        return self._render("error.html", status=status, code=code, message=message)
