"""A small JSON-over-HTTP client for the providers (stdlib only), with the errors mapped to ours.

Connection failures, timeouts and 5xx answers become `ProviderUnreachable`
(the lease waits and retries); 4xx answers become `ProviderRefused`. The
request's headers (credentials) never enter a message; the provider's own
error text does, shortened.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from reconciler.providers.protocols import ProviderRefused, ProviderUnreachable

_MAX_MESSAGE = 500


class Response:
    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


def request(
    method: str,
    url: str,
    *,
    provider: str,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout: float = 10.0,
    missing_ok: bool = False,
) -> Response | None:
    """One HTTP request; None for a 404 when `missing_ok`."""
    # http(s) only: the provider URL's pattern in desired.models allows no other scheme.
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))  # noqa: S310
    what = f"{provider}: {method} {_path(url)}"
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only: the models allow no other scheme
            return Response(resp.status, resp.read())
    except urllib.error.HTTPError as e:
        text = _text(e.read())
        if e.code == 404 and missing_ok:
            return None
        if e.code >= 500:
            raise ProviderUnreachable(f"{what} answered {e.code}: {text}") from None
        raise ProviderRefused(f"{what} refused ({e.code}): {text}") from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ProviderUnreachable(f"{what}: {reason}") from None


def _path(url: str) -> str:
    # Only the path: a URL may carry a query, and a query may carry something private.
    return urllib.parse.urlparse(url).path or "/"


def _text(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:_MAX_MESSAGE]
    # Ironic nests its message as JSON in error_message.faultstring.
    if isinstance(data, dict) and isinstance(data.get("error_message"), str):
        try:
            inner = json.loads(data["error_message"])
            if isinstance(inner, dict) and isinstance(inner.get("faultstring"), str):
                return str(inner["faultstring"])[:_MAX_MESSAGE]
        except ValueError:
            return str(data["error_message"])[:_MAX_MESSAGE]
    return json.dumps(data)[:_MAX_MESSAGE]
