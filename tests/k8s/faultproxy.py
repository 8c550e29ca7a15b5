"""A fault-injecting HTTPS reverse proxy in front of the real API server (issue 38), where the emulator's
``/_test/faults`` used to be: the operator's kubeconfig points at it (:meth:`FaultProxy.kubeconfig_for`: same token,
the proxy's URL, the control plane's CA, which issued the proxy's serving certificate for IP 127.0.0.1), and it
forwards every request to kube-apiserver, bearer token and all, verifying the API server's certificate with that CA.
Long-lived answers (watches, followed logs) are streamed through as they arrive.

Faults are :class:`Rule` s, set from the test process (the proxy runs on a thread of its own): a rule matches a method,
a path (a regular expression searched in the path), watch requests or others, and the requester's bearer token, fires
at most ``times`` times and counts its ``hits``. Its action is one of :class:`Answer` (a status and the Status body
kube-apiserver sends, e.g. 503 on discovery, 429 with Retry-After, 500), :class:`Delay` (then forwarded),
:class:`CutWatch` (the stream ends after N events or seconds, as when a connection is cut or the server's timeout ends
it) or :class:`Expire` (a watch answered the way kube-apiserver answers a resourceVersion older than its watch cache
holds: 200 and an ERROR event with a 410 Expired Status; or HTTP 410). The first matching rule that still may fire
applies. Every request is kept as an :class:`Exchange` (what was asked, what was answered, which rule fired), in order.

It binds 127.0.0.1 and dials only the API server's loopback URL; anything else is refused when it is built. What it
cannot carry: client-certificate authentication (TLS ends here: such requests reach the API server anonymous) and
protocol upgrades (exec, attach, port-forward)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ipaddress
import json
import re
import ssl
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import yaml
from aiohttp import web
from yarl import URL

from attune.operator import certs

#: headers of one hop only, never forwarded (and Accept-Encoding: answers come back unencoded, so that watch events
#: can be counted line by line)
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding",
                         "upgrade", "host", "content-length", "accept-encoding"})
#: headers aiohttp would add of its own: only the client's are sent (the official Python client sends a JSON body
#: without a Content-Type, which kube-apiserver reads as JSON; aiohttp's own "application/octet-stream" gets 415)
AUTO_HEADERS = ("Content-Type", "User-Agent", "Accept-Encoding")
#: the ``reason`` and default message kube-apiserver gives each status in its Status objects
REASONS = {400: ("BadRequest", "the server rejected our request for an unknown reason"),
           403: ("Forbidden", "forbidden"),
           404: ("NotFound", "the server could not find the requested resource"),
           409: ("Conflict", "the object has been modified; please apply your changes to the latest version"),
           410: ("Expired", "too old resource version"),
           429: ("TooManyRequests", "Too many requests, please try again later."),
           500: ("InternalError", "an error on the server has prevented the request from succeeding"),
           503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
           504: ("Timeout", "the server was unable to return a response in the time allotted")}


class FaultProxyError(RuntimeError):
    """The proxy cannot be set up as asked: the message says what to change."""


@dataclass(frozen=True)
class Answer:
    """Answer with ``status`` and a Kubernetes Status body (``reason`` and ``message`` default to the API server's
    for the status); ``retry_after`` adds the Retry-After header and ``details.retryAfterSeconds``."""

    status: int
    message: str | None = None
    reason: str | None = None
    retry_after: int | None = None


@dataclass(frozen=True)
class Delay:
    """Wait ``seconds`` (a slow API server), then forward."""

    seconds: float


@dataclass(frozen=True)
class CutWatch:
    """Forward, and end the answer's stream after ``after_events`` events or ``after_seconds``, whichever is first."""

    after_events: int | None = None
    after_seconds: float | None = None


@dataclass(frozen=True)
class Expire:
    """A watch's resourceVersion is too old: kube-apiserver's answer (200, then an ERROR event holding a Status with
    code 410, reason Expired, ``too old resource version: <asked> (<current>)``, then the end of the stream); with
    ``as_event`` False, HTTP 410 with that Status."""

    as_event: bool = True


Action = Answer | Delay | CutWatch | Expire


@dataclass
class Rule:
    """A fault: ``action`` on the requests matching every given criterion (see the module doc)."""

    action: Action
    method: str | None = None
    path: str = ""
    watch: bool | None = None
    token: str | None = None
    times: int | None = None
    hits: int = 0

    def __post_init__(self) -> None:
        self._path = re.compile(self.path)

    def matches(self, method: str, path: str, watch: bool, token: str | None) -> bool:
        return ((self.times is None or self.hits < self.times)
                and (self.method is None or self.method.upper() == method.upper())
                and bool(self._path.search(path))
                and (self.watch is None or self.watch == watch)
                and (self.token is None or self.token == token))


@dataclass
class Exchange:
    """One request through the proxy: when it came (monotonic seconds), what it asked, the status answered (None
    while waiting on the API server), the rule that fired (its index, None when forwarded untouched), the watch
    events passed on and the resourceVersion of the last, and when the answer ended."""

    at: float
    method: str
    path: str
    query: dict[str, str]
    token: str | None = field(repr=False)
    watch: bool
    status: int | None = None
    rule: int | None = None
    events: list[str] = field(default_factory=list)
    last_resource_version: str | None = None
    ended: float | None = None


def status_body(code: int, message: str | None = None, reason: str | None = None,
                retry_after: int | None = None) -> dict[str, Any]:
    """A ``v1 Status`` as kube-apiserver writes one for a failed request."""
    default_reason, default_message = REASONS.get(code, ("", ""))
    body: dict[str, Any] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                            "message": message or default_message, "reason": reason or default_reason}
    if retry_after is not None:
        body["details"] = {"retryAfterSeconds": retry_after}
    body["code"] = code
    return body


def kubeconfig_token(kubeconfig: Path) -> str:
    """The bearer token of ``kubeconfig``'s first user (what a rule's ``token`` matches)."""
    return str(yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"])


def _loopback(host: str, what: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise FaultProxyError(f"the fault proxy {what} loopback addresses only: {host!r} is not one "
                              "(use 127.0.0.1)")


def _is_watch(path: str, query: dict[str, str]) -> bool:
    return query.get("watch") in ("true", "1") or "/watch/" in path


def _bearer(headers: Any) -> str | None:
    auth = str(headers.get("Authorization") or "")
    return auth[len("Bearer "):].strip() if auth.startswith("Bearer ") else None


class FaultProxy:
    """The proxy (see the module doc) in front of ``upstream`` (the API server's ``https://127.0.0.1:<port>``),
    trusting and issuing from the CA of ``pki`` (``ca.crt``, ``ca.key``); its files go to ``workdir``. Use it as a
    context manager, or :meth:`start` and :meth:`close`."""

    def __init__(self, upstream: str, pki: Path, workdir: Path, host: str = "127.0.0.1") -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "https" or not parts.hostname or not parts.port:
            raise FaultProxyError(f"the fault proxy's upstream must be https://127.0.0.1:<port>, not {upstream!r}")
        _loopback(parts.hostname, "dials")
        _loopback(host, "listens on")
        self.upstream, self.host = f"https://{parts.hostname}:{parts.port}", host
        self.ca = pki / "ca.crt"
        workdir.mkdir(parents=True, exist_ok=True)
        cert, key = certs.new_serving(self.ca.read_bytes(), (pki / "ca.key").read_bytes(), ["localhost"],
                                      dt.datetime.now(dt.UTC), ip_addresses=[host])
        self.cert_file, self.key_file = workdir / "proxy.crt", workdir / "proxy.key"
        self.cert_file.write_bytes(cert)
        self.key_file.write_bytes(key)
        self.key_file.chmod(0o600)
        self.rules: list[Rule] = []
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://{self.host}:{self.port}"

    # - rules, from the test's thread -
    def add(self, rule: Rule) -> Rule:
        """Apply ``rule`` from now on, after the rules already set; returns it (its ``hits`` count as it fires)."""
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """No more faults: every request is forwarded untouched."""
        with self._lock:
            self.rules.clear()

    def seen(self, **match: Any) -> list[Exchange]:
        """The exchanges so far whose attributes equal ``match`` (e.g. ``watch=True, token=...``), in order."""
        with self._lock:
            return [e for e in self.exchanges if all(getattr(e, k) == v for k, v in match.items())]

    def _fire(self, exchange: Exchange) -> tuple[int, Rule] | None:
        with self._lock:
            self.exchanges.append(exchange)
            for i, rule in enumerate(self.rules):
                if rule.matches(exchange.method, exchange.path, exchange.watch, exchange.token):
                    rule.hits += 1
                    exchange.rule = i
                    return i, rule
        return None

    # - kubeconfigs -
    def kubeconfig_for(self, kubeconfig: Path, out: Path) -> Path:
        """``kubeconfig`` with every cluster's server the proxy and its CA the control plane's (which issued the
        proxy's certificate): the same credentials, through the proxy."""
        cfg = yaml.safe_load(kubeconfig.read_text())
        for entry in cfg.get("clusters") or []:
            cluster = entry["cluster"]
            cluster.pop("certificate-authority-data", None)
            cluster.update({"server": self.url, "certificate-authority": str(self.ca)})
        out.write_text(json.dumps(cfg))
        return out

    # - the server, on its own thread -
    def start(self) -> FaultProxy:
        ready = threading.Event()
        failed: list[BaseException] = []
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._serve())
            except BaseException as err:  # noqa: BLE001 - handed to the starting thread
                failed.append(err)
                ready.set()
                return
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failed:
            raise FaultProxyError(f"the fault proxy did not start: {failed[0] if failed else 'no answer in 30 s'}")
        return self

    async def _serve(self) -> None:
        upstream_tls = ssl.create_default_context(cafile=str(self.ca))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=upstream_tls),
                                              timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                              auto_decompress=False)
        serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving.load_cert_chain(self.cert_file, self.key_file)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, ssl_context=serving)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    def close(self) -> None:
        if self._loop is None or self._thread is None:
            return
        loop = self._loop

        async def shutdown() -> None:
            if self._session is not None:
                await self._session.close()  # ends the streams being forwarded
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), loop).result(30)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            self._thread.join(30)
            loop.close()
            self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # - one request -
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        query = dict(parse_qsl(request.query_string, keep_blank_values=True))
        ex = Exchange(time.monotonic(), request.method, request.path, query, _bearer(request.headers),
                      _is_watch(request.path, query))
        fired = self._fire(ex)
        action = fired[1].action if fired else None
        try:
            if isinstance(action, Answer):
                return self._status(ex, action.status, action.message, action.reason, action.retry_after)
            if isinstance(action, Expire):
                return await self._expire(request, ex, action)
            if isinstance(action, Delay):
                await asyncio.sleep(action.seconds)  # the fault itself: a slow answer
            return await self._forward(request, ex, action if isinstance(action, CutWatch) else None)
        finally:
            ex.ended = time.monotonic()

    def _status(self, ex: Exchange, code: int, message: str | None, reason: str | None,
                retry_after: int | None) -> web.Response:
        ex.status = code
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        return web.json_response(status_body(code, message, reason, retry_after), status=code, headers=headers)

    async def _expire(self, request: web.Request, ex: Exchange, action: Expire) -> web.StreamResponse:
        asked = ex.query.get("resourceVersion", "")
        current = await self._current_version(request)
        message = f"too old resource version: {asked} ({current})"
        if not (action.as_event and ex.watch):
            return self._status(ex, 410, message, "Expired", None)
        ex.status = 200
        resp = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        event = json.dumps({"type": "ERROR", "object": status_body(410, message, "Expired")}, separators=(",", ":"))
        ex.events.append("ERROR")
        await resp.write(event.encode() + b"\n")
        await resp.write_eof()
        return resp

    async def _current_version(self, request: web.Request) -> str:
        """The collection's resourceVersion now (a list of one item, with the requester's credentials)."""
        assert self._session is not None
        url = URL(self.upstream + request.path, encoded=True).with_query({"limit": "1"})
        try:
            async with self._session.get(url, headers=self._headers(request), skip_auto_headers=AUTO_HEADERS) as resp:
                body = await resp.json(content_type=None)
            return str(((body or {}).get("metadata") or {}).get("resourceVersion") or "")
        except (aiohttp.ClientError, ValueError):
            return ""

    @staticmethod
    def _headers(request: web.Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}

    async def _forward(self, request: web.Request, ex: Exchange, cut: CutWatch | None) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read() if request.body_exists else None
        url = URL(self.upstream + request.raw_path, encoded=True)
        async with self._session.request(request.method, url, headers=self._headers(request), data=body,
                                         allow_redirects=False, skip_auto_headers=AUTO_HEADERS) as up:
            ex.status = up.status
            headers = {k: v for k, v in up.headers.items() if k.lower() not in HOP_HEADERS}
            if up.content_length is not None and not ex.watch:  # a whole answer: passed on as it is
                return web.Response(status=up.status, body=await up.read(), headers=headers)
            resp = web.StreamResponse(status=up.status, headers=headers)
            await resp.prepare(request)
            try:
                if ex.watch:
                    await self._pass_events(up, resp, ex, cut)
                else:
                    async for chunk in up.content.iter_any():
                        await resp.write(chunk)
                await resp.write_eof()
            except (aiohttp.ClientError, ConnectionError):
                pass  # the API server or the client went away: nothing more to pass on
            return resp

    @staticmethod
    def _note_event(ex: Exchange, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        ex.events.append(str(event.get("type")))
        version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
        if version:
            ex.last_resource_version = str(version)

    async def _pass_events(self, up: aiohttp.ClientResponse, resp: web.StreamResponse, ex: Exchange,
                           cut: CutWatch | None) -> None:
        """Pass the watch's events on one by one (a line each), ending after ``cut``'s events or seconds."""
        limit = cut.after_events if cut else None
        try:
            async with asyncio.timeout(cut.after_seconds if cut else None):
                while limit is None or len(ex.events) < limit:
                    line = await up.content.readline()
                    if not line:
                        return
                    self._note_event(ex, line)  # noted first: whoever reads the event finds it noted
                    await resp.write(line)
        except TimeoutError:
            return
