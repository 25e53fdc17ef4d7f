"""Who may talk to a listening socket: the rules shared by `completer serve` (aiohttp) and the
language server's `--tcp` / `--ws` transports. Plain functions over strings; no torch, no HTTP
library.

- Bind: loopback by default; any other address needs a token (`listen_refusal`).
- Token: `Authorization: Bearer T` or `?token=T` (WebSocket and HTTP), compared in constant time
  as bytes; a header that is not ASCII is a wrong token, never an error (`token_matches`).
- Origin (browsers send it on every WebSocket and cross-site request): none (not a browser) or a
  localhost page passes; other pages only when listed in allow_origins (`origin_allowed`).
- Host: a DNS-rebinding page reaches 127.0.0.1 under its own name, which the browser puts in the
  Host header (and in the Origin of a same-origin request, which carries none). An IP literal or
  `localhost` cannot be rebound; any other name must be the bound address or listed in
  allow_hosts (`host_allowed`).
- Raw TCP: a browser can POST to any port, and an LSP framing that resynchronises would read the
  POST body as a message: a connection whose first line is an HTTP request line is closed
  (`looks_like_http`).
"""
from __future__ import annotations

import hmac
import ipaddress
import re
from urllib.parse import urlsplit

LOOPBACK_NAMES = ("localhost",)
_HTTP_REQUEST_LINE = re.compile(rb"^[A-Z]{3,10} \S+ HTTP/\d")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 and `localhost`; a name other than localhost may resolve anywhere."""
    host = host.strip().strip("[]").rstrip(".").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_refusal(host: str, token: str | None, flag: str = "--host") -> str | None:
    """Why binding `host` without a token is refused, or None when it is fine."""
    if token or is_loopback(host):
        return None
    return (f"{flag} {host} is not a loopback address: give --token (or COMPLETER_TOKEN) so that other machines "
            "cannot use it unauthenticated")


def given_token(authorization: str | None, query_token: str | None) -> str | None:
    """The token a request carries (the query's wins: browsers cannot set headers on a WebSocket)."""
    if query_token is not None:
        return query_token
    auth = authorization or ""
    return auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else None


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison; any text (a non-ASCII header, a lone surrogate) is only wrong."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def origin_allowed(origin: str | None, allow: tuple[str, ...]) -> bool:
    """No Origin (not a browser) and localhost pages pass; other origins must be listed ('*' = any)."""
    if origin is None or "*" in allow or origin in allow:
        return True
    try:
        u = urlsplit(origin)
        hostname, _ = u.hostname or "", u.port  # .port checks the port
    except ValueError:  # a malformed Origin (bad port, brackets) is no localhost page
        return False
    return u.scheme in ("http", "https") and is_loopback(hostname)


def host_allowed(host_header: str | None, bound: str, allow: tuple[str, ...] = ()) -> bool:
    """The Host header names this server: an IP literal, localhost, the bound name or a listed one."""
    if host_header is None or "*" in allow:
        return True  # HTTP/1.0 tools send none; a browser always does
    name = _host_name(host_header)
    if name is None:
        return False
    if _is_address_or_localhost(name):
        return True
    wanted = {bound.strip("[]").rstrip(".").lower(), *(a.strip("[]").rstrip(".").lower() for a in allow)}
    return name in wanted


def looks_like_http(first_line: bytes) -> bool:
    """An HTTP request line ("POST / HTTP/1.1"), which no LSP client sends."""
    return bool(_HTTP_REQUEST_LINE.match(first_line.lstrip()))


def _host_name(host_header: str) -> str | None:
    """The name in a Host header without its port, lowercased; None when it is malformed."""
    try:
        return (urlsplit("//" + host_header.strip()).hostname or "").rstrip(".") or None
    except ValueError:
        return None


def _is_address_or_localhost(name: str) -> bool:
    if name in LOOPBACK_NAMES:
        return True
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False
