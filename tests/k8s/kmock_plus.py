"""Test-only: a thin subclass of kmock.KubernetesEmulator (kmock 0.8) that fills the gaps found when
driving it with kopf 1.45, the official `kubernetes` python client and kubectl 1.32.

Adds: metadata.resourceVersion/uid/creationTimestamp/generation, 201 on create,
422 on failed JSON-patch `test` ops (optimistic concurrency), List kind/apiVersion,
label selectors on list/watch, resourceVersion-aware race-free watch with timeoutSeconds,
application/json watch content type, PUT (replace), core-v1 discovery groupVersion fix,
cluster-scoped /api/v1/namespaces paths, and GET .../pods/{name}/log served from the file a stand-in
kubelet writes (the pod's annotation LOG_PATH_ANNOTATION names it; lines carry the kubelet's RFC 3339 nano
timestamp, stripped unless ?timestamps=true, as the real API does).
"""
from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import re
import time
import uuid

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import enums, parsing, rendering

# --- /api/v1/namespaces[/name[/status|finalize]] is the cluster-scoped Namespace resource
_orig_parse_path = parsing.parse_path
def _parse_path(path: str) -> parsing.ParsedPath:
    parts = path.strip('/').split('/')
    if len(parts) >= 3 and parts[0] == 'api' and parts[2] == 'namespaces' and (
            len(parts) <= 4 or (len(parts) == 5 and parts[4] in ('status', 'finalize'))):
        rest = parts[3:]
        return parsing.ParsedPath(group='', version=parts[1], plural='namespaces', namespace=None,
                                  name=rest[0] if rest else None,
                                  subresource=rest[1] if len(rest) > 1 else None)
    return _orig_parse_path(path)
parsing.parse_path = _parse_path


def match_labels(labels: dict, selector: str | None) -> bool:
    if not selector:
        return True
    for term in re.split(r',(?![^()]*\))', selector):
        term = term.strip()
        if m := re.fullmatch(r'([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)', term):
            key, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(',')}
            if (labels.get(key) in vals) != (op == 'in'):
                return False
        elif m := re.fullmatch(r'([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)', term):
            key, op, val = m.groups()
            if (labels.get(key) == val) != (op in ('=', '==')):
                return False
        elif term.startswith('!'):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


#: test-only annotation on a Pod: the local file holding its (timestamped) log, written by the stand-in kubelet
LOG_PATH_ANNOTATION = 'kmock.attune.test/log-path'
_LOG_STAMP = re.compile(r'^\S+ ')


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    return aiohttp.web.json_response({'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
                                      'message': message, 'reason': reason, 'code': code}, status=code)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def _merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge_patch(out.get(k), v)
    return out


@attrs.define(kw_only=True)
class KubernetesEmulatorPlus(kmock.KubernetesEmulator):
    _rv: itertools.count = attrs.field(factory=lambda: itertools.count(1000), init=False)
    admissions: list = attrs.field(factory=list, init=False)
    _pending: set = attrs.field(factory=set, init=False)   # versions handed out to writes not yet stored

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock streams watches as application/octet-stream; client-go (kubectl -w / wait) rejects that.
        (self.fallback ** 1)[enums.action.WATCH] << {'Content-Type': 'application/json'} << self._serve_watch

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _reserve_rv(self) -> str:
        """A version for a create or patch that kmock stores later, under its lock: pending until then."""
        rv = self._next_rv()
        self._pending.add(int(rv))
        return rv

    def _list_rv(self) -> str:
        """The version a list reports, taken before its snapshot: every write at or below it is stored, so a watch
        from it misses none (a create handed its version before the list but stored after it is still sent)."""
        return str(min(self._pending) - 1) if self._pending else self._next_rv()

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.subresource == 'log' and request.name \
                and request.resource.group == '' and request.resource.plural == 'pods' \
                and request.method == enums.method.GET:
            return await self._serve_pod_log(request)
        if request.resource is not None and request.subresource is None:
            denied = await self._admit(request)
            if denied is not None:
                return denied
        reserved = None
        if request.resource is not None:
            if request.action == enums.action.CREATE and isinstance(request.data, dict):
                meta = request.data.setdefault('metadata', {})
                meta.setdefault('uid', str(uuid.uuid4()))
                if not meta.get('name') and meta.get('generateName'):  # kopf's Events use generateName
                    meta['name'] = meta['generateName'] + uuid.uuid4().hex[:5]
                meta['creationTimestamp'] = meta.get('creationTimestamp') or _now()
                meta['generation'] = 1
                meta['resourceVersion'] = reserved = self._reserve_rv()
                if request.namespace and 'namespace' not in meta:
                    meta['namespace'] = request.namespace
            elif request.action == enums.action.UPDATE and request.name:
                key = (request.resource, request.namespace, request.name)
                if key in self._objects and not self._objects[key].deleted:
                    current = self._objects[key].raw
                    if isinstance(request.data, list):      # JSON-patch: enforce `test` ops -> 422
                        try:
                            jsonpatch.apply_patch(current, request.data)
                        except (jsonpatch.JsonPatchConflict, jsonpatch.JsonPatchTestFailed,
                                jsonpatch.JsonPointerException) as e:
                            raise kmock.KubernetesError(status=422, reason='Invalid', message=str(e)) from e
                    rv = reserved = self._reserve_rv()
                    if isinstance(request.data, list):
                        request.data.append({'op': 'add', 'path': '/metadata/resourceVersion', 'value': rv})
                    elif isinstance(request.data, dict):    # merge / strategic-merge (treated as merge)
                        if not isinstance(request.data.get('metadata'), dict):
                            request.data['metadata'] = {}
                        request.data['metadata']['resourceVersion'] = rv
                        if 'spec' in request.data and request.subresource is None:
                            request.data['metadata']['generation'] = current.get('metadata', {}).get('generation', 1) + 1
            elif request.action == enums.action.DELETE and request.name:
                return await self._delete(request)
            elif request.method == enums.method.PUT and request.name:
                return await self._replace(request)
        try:
            return await super()._handle(request)
        finally:
            if reserved is not None:
                self._pending.discard(int(reserved))

    # --- validating admission webhooks (ValidatingWebhookConfiguration objects with clientConfig.url)
    def _webhooks(self, request: rendering.Request, operation: str) -> list[dict]:
        res = request.resource
        out = []
        for (r, _ns, _name), obj in list(self._objects.items()):
            if obj.deleted or r.plural != 'validatingwebhookconfigurations':
                continue
            for hook in obj.raw.get('webhooks') or []:
                for rule in hook.get('rules') or []:
                    if (operation in rule.get('operations', []) or '*' in rule.get('operations', [])) and \
                            res.group in rule.get('apiGroups', []) and res.plural in rule.get('resources', []):
                        out.append(hook)
                        break
        return out

    async def _admit(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """Call the matching validating webhooks, as the API server does, with the object the request would make."""
        if request.action == enums.action.CREATE and isinstance(request.data, dict):
            operation, old, new = 'CREATE', None, copy.deepcopy(request.data)
        elif request.action == enums.action.UPDATE and request.name and request.data is not None:
            key = (request.resource, request.namespace, request.name)
            if key not in self._objects or self._objects[key].deleted:
                return None
            old = copy.deepcopy(self._objects[key].raw)
            operation = 'UPDATE'
            if isinstance(request.data, list):
                try:
                    new = jsonpatch.apply_patch(old, request.data)
                except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException):
                    return None
            else:
                new = _merge_patch(old, request.data)
        else:
            return None
        hooks = self._webhooks(request, operation)
        for hook in hooks:
            res = request.resource
            review = {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview', 'request': {
                'uid': str(uuid.uuid4()), 'operation': operation, 'name': request.name or new.get('metadata', {}).get('name'),
                'namespace': request.namespace,
                'kind': {'group': res.group, 'version': res.version, 'kind': self.resources[res].kind or ''},
                'resource': {'group': res.group, 'version': res.version, 'resource': res.plural},
                'requestKind': {'group': res.group, 'version': res.version, 'kind': self.resources[res].kind or ''},
                'requestResource': {'group': res.group, 'version': res.version, 'resource': res.plural},
                'userInfo': {'username': 'kmock'}, 'object': new, 'oldObject': old, 'dryRun': False}}
            try:
                async with aiohttp.ClientSession() as session, session.post(
                        hook['clientConfig']['url'], json=review, timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    answer = (await resp.json())['response']
            except Exception as err:  # noqa: BLE001 - like the API server: the failure policy decides
                if hook.get('failurePolicy', 'Fail') == 'Ignore':
                    continue
                return _status(500, 'InternalError', f'failed calling webhook "{hook.get("name")}": {err}')
            self.admissions.append((operation, res.plural, request.name, bool(answer.get('allowed'))))
            if not answer.get('allowed'):
                st = answer.get('status') or {}
                code = int(st.get('code') or 403)
                return _status(code, 'Forbidden' if code == 403 else 'Invalid',
                               f'admission webhook "{hook.get("name")}" denied the request: {st.get("message", "")}')
        return None

    async def _serve_pod_log(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """GET /api/v1/namespaces/{ns}/pods/{name}/log: container, timestamps, tailLines, limitBytes."""
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            obj = self._objects[key] if key in self._objects else None  # noqa: SIM401 - kmock's array has no .get
            raw = copy.deepcopy(obj.raw) if obj is not None and not obj.deleted else None
        if raw is None:
            return _status(404, 'NotFound', f'pods "{request.name}" not found')
        containers = [c.get('name') for c in (raw.get('spec') or {}).get('containers') or []]
        container = request.params.get('container')
        if container is None and len(containers) != 1:
            return _status(400, 'BadRequest', f'a container name must be specified for pod {request.name}, '
                                              f'choose one of: {containers}')
        if container is not None and container not in containers:
            return _status(400, 'BadRequest', f'container {container} is not valid for pod {request.name}')
        path = ((raw.get('metadata') or {}).get('annotations') or {}).get(LOG_PATH_ANNOTATION)
        try:
            with open(path, 'rb') as f:  # noqa: ASYNC230 - a small local file, as a kubelet's would be
                text = f.read().decode('utf-8', errors='replace')
        except (OSError, TypeError):
            return _status(400, 'BadRequest', f'container "{container}" in pod "{request.name}" is waiting to start')
        lines = text.splitlines(keepends=True)
        if lines and not lines[-1].endswith('\n'):
            lines.pop()  # the kubelet serves whole lines
        if request.params.get('tailLines'):
            lines = lines[-int(request.params['tailLines']):] if int(request.params['tailLines']) else []
        if request.params.get('timestamps', 'false').lower() != 'true':
            lines = [_LOG_STAMP.sub('', line, count=1) for line in lines]
        body = ''.join(lines).encode()
        if request.params.get('limitBytes'):
            body = body[:int(request.params['limitBytes'])]
        return aiohttp.web.Response(body=body, content_type='text/plain', charset='utf-8')

    async def _delete(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            obj = self._objects[key]
            meta = obj.raw.get('metadata', {})
            if meta.get('deletionTimestamp'):
                return aiohttp.web.json_response(obj.raw)
            if meta.get('finalizers'):
                obj.patch({'metadata': {'deletionTimestamp': _now(), 'resourceVersion': self._next_rv()}})
                raw = obj.raw
                await self._buses[request.resource].put({'type': 'MODIFIED', 'object': raw})
                return aiohttp.web.json_response(raw)
            raw = copy.deepcopy(obj.raw)
            raw['metadata']['resourceVersion'] = self._next_rv()
            obj.delete()
            await self._buses[request.resource].put({'type': 'DELETED', 'object': raw})
            return aiohttp.web.json_response(raw)

    async def _replace(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            old = self._objects[key].raw
            new = dict(request.data)
            meta = new.setdefault('metadata', {})
            sent_rv = meta.get('resourceVersion')
            if sent_rv and sent_rv != old['metadata'].get('resourceVersion'):
                raise kmock.KubernetesError(status=409, reason='Conflict', message='resourceVersion mismatch')
            for k in ('uid', 'creationTimestamp', 'generation', 'finalizers', 'deletionTimestamp'):
                if k in old['metadata']:
                    meta.setdefault(k, old['metadata'][k])
            meta['resourceVersion'] = self._next_rv()
            self._objects[key].create(new)
            raw = self._objects[key].raw
            await self._buses[request.resource].put({'type': 'MODIFIED', 'object': raw})
        return aiohttp.web.json_response(raw)

    async def _serve_create(self, request):
        return rendering.Response(status=201, payload=await super()._serve_create(request))

    async def _serve_list(self, request):
        rv = self._list_rv()
        result = await super()._serve_list(request)
        sel = request.params.get('labelSelector')
        items = [o for o in result['items'] if match_labels(o.get('metadata', {}).get('labels') or {}, sel)]
        info = self.resources[request.resource]
        gv = f"{request.resource.group}/{request.resource.version}".lstrip('/')
        kind = info.kind or (request.resource.plural or '').capitalize()
        return {'apiVersion': gv, 'kind': f'{kind}List',
                'metadata': {'resourceVersion': rv}, 'items': items}

    def _visible(self, request, namespace, name, raw) -> bool:
        return ((request.namespace is None or namespace == request.namespace)
                and (request.name is None or name == request.name)
                and match_labels(raw.get('metadata', {}).get('labels') or {}, request.params.get('labelSelector')))

    async def _serve_watch(self, request):
        yield b''
        since = request.params.get('resourceVersion') or '0'
        timeout = float(request.params.get('timeoutSeconds') or 0) or None
        deadline = None if timeout is None else time.monotonic() + timeout
        bus = self._buses[request.resource]
        async with self._lock:   # subscribe and snapshot atomically: no lost events
            marker = await bus.mark()
            snapshot = [obj.raw for (res, ns, name), obj in self._objects.items()
                        if res == request.resource and not obj.deleted
                        and self._visible(request, ns, name, obj.raw)]
        try:
            for raw in snapshot:
                rv = int(raw.get('metadata', {}).get('resourceVersion') or 0)
                if since == '0' or rv > int(since):
                    yield {'type': 'ADDED', 'object': raw}
            stream = aiter(bus.stream(since=marker))
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                try:
                    event = await asyncio.wait_for(anext(stream), remaining)
                except TimeoutError:
                    return
                meta = event.get('object', {}).get('metadata', {})
                if self._visible(request, meta.get('namespace'), meta.get('name'), event.get('object', {})):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        # client-go's errors.IsAlreadyExists()/IsNotFound() need the standard Status reasons.
        from kmock._internal.k8s import KubernetesObjectConflictError
        if isinstance(exc, KubernetesObjectConflictError):
            exc = kmock.KubernetesError(status=409, reason='AlreadyExists', message=exc.message)
        elif isinstance(exc, kmock.KubernetesNotFoundError):
            exc = kmock.KubernetesError(status=404, reason='NotFound', message=exc.message)
        return await super()._render_error(exc)

    async def _serve_version(self, request):
        result = await super()._serve_version(request)
        result['groupVersion'] = result['groupVersion'].lstrip('/')
        return result
