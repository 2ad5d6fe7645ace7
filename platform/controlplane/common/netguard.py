"""Server-side request forgery guard: may the platform open a connection to this URL's host?

Only public addresses may be reached. Every form of an internal address is refused: loopback, 0.0.0.0,
private ranges, shared (CGNAT), link-local (cloud metadata at 169.254.169.254 included), unique-local IPv6,
multicast and reserved ranges, IPv4-mapped / NAT64 / 6to4 IPv6 forms of those, and the numeric spellings a C
resolver accepts (2130706433, 0x7f000001, 0177.0.0.1, 127.1). A name is resolved and refused if any of its
addresses is internal. Connections made through `guarded_session` resolve the name once, check every answer
and connect to the checked address itself, so a name that changes its answer between the check and the
connection (DNS rebinding) gets nowhere; the fetcher checks every redirect's target the same way.

Operators with an internal mirror may allow exact `host:port` pairs (FLEETYARD_FETCH_ALLOW_HOSTS).
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import requests
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError
from urllib3.util import connection

FETCH_SCHEMES = ("http", "https")
METADATA_NAMES = {"metadata", "metadata.google.internal", "metadata.goog", "instance-data",
                  "instance-data.ec2.internal"}
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class UnsafeURL(ValueError):
    """The URL must not be fetched; the message says why in words a user can act on."""


def resolve(host: str, port: int) -> list[str]:
    """Every address the system resolver gives for host (module-level so tests can stand in for DNS)."""
    return sorted({info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)})


def internal_reason(address: str) -> str | None:
    """Why this IP address is internal, or None when it is a public (globally routable) address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        embedded = ip.ipv4_mapped or ip.sixtofour
        if embedded is None and ip in NAT64:
            embedded = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if embedded is not None:
            inner = internal_reason(str(embedded))
            return f"{inner} (inside the IPv6 address {ip})" if inner else None
    for test, words in ((ip.is_unspecified, "the unspecified address"), (ip.is_loopback, "a loopback address"),
                        (ip.is_link_local, "a link-local address (cloud metadata lives there)"),
                        (ip.is_multicast, "a multicast address"), (ip.is_private, "a private address"),
                        (ip.is_reserved, "a reserved address")):
        if test:
            return f"{ip} is {words}"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None


def allowed_hosts() -> set[str]:
    from django.conf import settings

    return {entry.strip().lower() for entry in getattr(settings, "FLEETYARD_FETCH_ALLOW_HOSTS", []) if entry.strip()}


def uri_without_credentials(uri: str) -> str:
    """`uri` with any user info (`user:password@`) before its host replaced by `***` (what a message may repeat of a URL
    a dataset version registered before credentials were refused)."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    authority, slash, path = rest.partition("/")
    if "@" not in authority:
        return uri
    return f"{scheme}://***@{authority.rpartition('@')[2]}{slash}{path}"


def _host_port(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:  # port 0 was taken for "none given" and checked as 443 or 80 (QA)
        raise UnsafeURL(f"{uri_without_credentials(url)!r} has an invalid port")
    if port is None:
        port = 443 if scheme == "https" else 80
    host = (parts.hostname or "").rstrip(".").lower()
    return host, port, scheme


def check_target(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL whose name is not internal; UnsafeURL otherwise. Resolves nothing."""
    host, port, scheme = _host_port(url)
    if scheme not in FETCH_SCHEMES:
        raise UnsafeURL(f"the platform fetches only {' and '.join(FETCH_SCHEMES)} URLs, not {scheme or 'no'} scheme")
    if not host:
        raise UnsafeURL(f"{uri_without_credentials(url)!r} names no host")
    if f"{host}:{port}" in allowed_hosts():
        return host, port
    if host in METADATA_NAMES or host.endswith((".internal", ".localhost")) or host == "localhost":
        raise UnsafeURL(f"{host} is an internal name")
    return host, port


def public_addresses(host: str, port: int, *, require_resolution: bool = True) -> list[str]:
    """Every address host resolves to, each checked to be public; UnsafeURL names the first that is not.

    With require_resolution=False a name that does not resolve now gives [] (numeric forms always
    resolve, so it is a name that may exist later; the connection checks again)."""
    try:
        addresses = resolve(host, port)
    except (socket.gaierror, UnicodeError, OSError):
        if require_resolution:
            raise UnsafeURL(f"{host} does not resolve") from None
        return []
    for address in addresses:
        reason = internal_reason(address)
        if reason:
            named = "" if address == host else f"{host} resolves to {address}: "
            raise UnsafeURL(f"{named}{reason}; the platform fetches only from public addresses")
    return addresses


def check_url(url: str, *, require_resolution: bool = True) -> list[str]:
    """The public addresses of url's host ([] for an allowed mirror); UnsafeURL if the platform must not
    connect there."""
    host, port = check_target(url)
    if f"{host}:{port}" in allowed_hosts():
        return []
    return public_addresses(host, port, require_resolution=require_resolution)


def vetted_address(host: str, port: int) -> str:
    """The address to connect to for host: resolved once, every answer checked (no second lookup to rebind)."""
    host = host.rstrip(".")
    if f"{host.lower()}:{port}" in allowed_hosts():
        return resolve(host, port)[0]
    return public_addresses(host, port)[0]


class _GuardedConnectionMixin:
    """Connects to the vetted address of the host (TLS and the Host header still use the name)."""

    def _new_conn(self):
        address = vetted_address(self.host, self.port)
        try:
            return connection.create_connection((address, self.port), self.timeout,
                                                source_address=self.source_address,
                                                socket_options=self.socket_options)
        except TimeoutError as exc:
            raise ConnectTimeoutError(self, f"connecting to {self.host} timed out") from exc
        except OSError as exc:
            raise NewConnectionError(self, f"failed to connect to {self.host}: {exc}") from exc


class _GuardedHTTPConnection(_GuardedConnectionMixin, HTTPConnection):
    pass


class _GuardedHTTPSConnection(_GuardedConnectionMixin, HTTPSConnection):
    pass


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


def guarded_session() -> requests.Session:
    """A requests session that ignores proxy variables and refuses to connect to any internal address."""
    session = requests.Session()
    session.trust_env = False
    for prefix in ("http://", "https://"):
        adapter = requests.adapters.HTTPAdapter(max_retries=0)
        adapter.poolmanager.pool_classes_by_scheme = {"http": _GuardedHTTPPool, "https": _GuardedHTTPSPool}
        session.mount(prefix, adapter)
    return session
