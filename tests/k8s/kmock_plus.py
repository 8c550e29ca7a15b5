"""Test-only: a subclass of kmock.KubernetesEmulator (kmock 0.8) that is as strict as a real API server where the
operator's tests need it, driven by kopf 1.45, the official `kubernetes` python client and kubectl 1.32.

Reads: resourceVersion-aware, race-free list-then-watch with timeoutSeconds and application/json watches; List
kind/apiVersion; label selectors parsed as apimachinery parses them (400 on an invalid one); core-v1 discovery
groupVersion fix and cluster-scoped /api/v1/namespaces paths; GET .../pods/{name}/log served from the file a stand-in
kubelet writes (the pod's annotation LOG_PATH_ANNOTATION names it; lines carry the kubelet's RFC 3339 nano
timestamp, stripped unless ?timestamps=true, as the real API does).

Writes (create, PATCH as JSON-patch / merge / strategic-merge-as-merge, PUT, DELETE) are done here, not by kmock,
in the API server's order (k8s.io/apiserver/pkg/endpoints/handlers, k8s.io/apiserver/pkg/registry/generic/registry):
authentication (bearer tokens), RBAC authorization (:mod:`tests.k8s.rbac`), injected faults, the object the request
would store (metadata preserved, status subresource semantics), defaulting and pruning (custom resources), validation
(:mod:`tests.k8s.apivalidation`: 422 Invalid), admission (OwnerReferencesPermissionEnforcement, then validating
webhooks with their timeoutSeconds and failurePolicy), then storage under optimistic concurrency (resourceVersion,
409 Conflict, 201 on create, generation bumped on spec changes, no-op writes not stored). CustomResourceDefinitions
written to it register the resource they define, with its schema.

Test controls (admin only): ``/_test/faults`` (POST rules, GET them with their hits, DELETE all) and ``/_test/authz``
(GET the recorded authorization decisions of the audited users, DELETE them).
"""
from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import itertools
import re
import time
import uuid
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
from kmock._internal import enums, parsing, references, rendering

from tests.k8s import apivalidation as av
from tests.k8s import rbac

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


match_labels = av.match_labels  # kept for its users: a selector (string or parsed) against an object's labels

#: test-only annotation on a Pod: the local file holding its (timestamped) log, written by the stand-in kubelet
LOG_PATH_ANNOTATION = 'kmock.attune.test/log-path'
_LOG_STAMP = re.compile(r'^\S+ ')
#: kinds whose names are path segments (k8s.io/apimachinery/pkg/api/validation/path), not DNS subdomains
_PATH_SEGMENT_NAMED = {'Role', 'ClusterRole', 'RoleBinding', 'ClusterRoleBinding'}
_WEBHOOK_TIMEOUT_DEFAULT = 10  # seconds: admissionregistration/v1 ValidatingWebhook.timeoutSeconds


def _status(code: int, reason: str, message: str, headers: dict[str, str] | None = None,
            details: dict | None = None) -> aiohttp.web.Response:
    body = {'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure', 'message': message,
            'reason': reason, 'code': code}
    if details:
        body['details'] = details
    return aiohttp.web.json_response(body, status=code, headers=headers)


def _error(err: av.APIError) -> aiohttp.web.Response:
    return aiohttp.web.json_response(err.status(), status=err.code, headers=err.headers or None)


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


def _method(request: rendering.Request) -> str:
    m = request.method
    return str(getattr(m, 'value', m)).upper()


def _verb(request: rendering.Request) -> str:
    """The request's verb as the API server's RequestInfoFactory names it."""
    method = _method(request)
    if request.resource is None or request.resource.plural is None:
        return method.lower()  # a non-resource request: the HTTP method
    if method == 'GET':
        return 'watch' if request.params.get('watch') in ('true', '1') else ('get' if request.name else 'list')
    return {'POST': 'create', 'PUT': 'update', 'PATCH': 'patch',
            'DELETE': 'delete' if request.name else 'deletecollection'}.get(method, method.lower())


def _without(obj: dict, *keys: str) -> dict:
    return {k: v for k, v in obj.items() if k not in keys}


@attrs.define
class Fault:
    """An injected fault: the requests it matches and what the API server answers them (or how long it stalls)."""

    id: int
    verb: str | None = None
    method: str | None = None
    group: str | None = None
    resource: str | None = None
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None
    path: str | None = None           # a non-resource path, e.g. discovery's /apis/kubeflow.org/v1 (exact)
    user: str = 'operator'            # 'operator' (the audited users) or 'any'
    status: int | None = None
    reason: str | None = None
    message: str | None = None
    retry_after: int | None = None
    delay: float = 0.0
    times: int | None = None          # None: every time
    hits: int = 0

    def matches(self, request: rendering.Request, verb: str, user: str, audited: set[str]) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        if self.user != 'any' and user not in audited:
            return False
        res = request.resource
        checks = [(self.verb, verb), (self.method, _method(request)), (self.path, request.url.path),
                  (self.group, res.group if res is not None else None),
                  (self.resource, res.plural if res is not None else None),
                  (self.subresource, request.subresource), (self.namespace, request.namespace),
                  (self.name, request.name)]
        return all(want is None or want == got for want, got in checks)

    def answer(self, request: rendering.Request) -> aiohttp.web.Response | None:
        if self.status is None:
            return None
        reason = self.reason or {403: 'Forbidden', 409: 'Conflict', 429: 'TooManyRequests', 500: 'InternalError',
                                 503: 'ServiceUnavailable', 504: 'Timeout'}.get(self.status, 'Unknown')
        message = self.message or {429: 'Too many requests, please try again later.',
                                   503: 'the server is currently unable to handle the request',
                                   500: 'Internal error occurred: injected fault'}.get(self.status, reason)
        headers = {'Retry-After': str(self.retry_after)} if self.retry_after is not None else None
        details = {'retryAfterSeconds': self.retry_after} if self.retry_after is not None else None
        return _status(self.status, reason, message, headers, details)


@attrs.define(kw_only=True)
class KubernetesEmulatorPlus(kmock.KubernetesEmulator):
    #: bearer token -> user name; empty: no authentication, every request is the admin's (the emulator's own tests)
    tokens: dict = attrs.field(factory=dict)
    #: users whose authorization decisions are recorded (the operator's ServiceAccount)
    audited: set = attrs.field(factory=set)
    #: the OwnerReferencesPermissionEnforcement admission plugin (OpenShift enables it)
    enforce_owner_references: bool = True
    admissions: list = attrs.field(factory=list, init=False)
    decisions: list = attrs.field(factory=list, init=False)
    faults: list = attrs.field(factory=list, init=False)
    schemas: dict = attrs.field(factory=dict, init=False)      # resource -> StructuralSchema (custom resources)
    _rv: itertools.count = attrs.field(factory=lambda: itertools.count(1000), init=False)
    _fault_ids: itertools.count = attrs.field(factory=lambda: itertools.count(1), init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        # kmock streams watches as application/octet-stream; client-go (kubectl -w / wait) rejects that.
        (self.fallback ** 1)[enums.action.WATCH] << {'Content-Type': 'application/json'} << self._serve_watch

    def _next_rv(self) -> str:
        return str(next(self._rv))

    def _list_rv(self) -> str:
        """The version a list reports, taken before its snapshot: every write is versioned and stored under the lock,
        so a watch from it misses none (an object stored after the version was taken is sent, maybe twice)."""
        return self._next_rv()

    # --- the request pipeline

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if request.url.path.startswith('/_test/'):
            return await self._control(request)
        user = self._authenticate(request)
        if user is None:
            return _status(401, 'Unauthorized', 'Unauthorized')
        verb = _verb(request)
        denied = self._authorize(request, user, verb)
        if denied is not None:
            return denied
        for fault in self.faults:
            if fault.matches(request, verb, user, self.audited):
                fault.hits += 1
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                answer = fault.answer(request)
                if answer is not None:
                    return answer
                break
        try:
            return await self._dispatch(request, user, verb)
        except av.APIError as err:
            return _error(err)

    async def _dispatch(self, request: rendering.Request, user: str, verb: str) -> aiohttp.web.StreamResponse:
        res = request.resource
        if request.url.path == '/version/':
            return aiohttp.web.json_response(await self._serve_server_version(request))
        if res is None or res.plural is None:
            return await super()._handle(request)
        if not any(r == res for r in self.resources):
            return _status(404, 'NotFound', 'the server could not find the requested resource')
        if request.subresource == 'log' and res.group == '' and res.plural == 'pods' and verb == 'get':
            return await self._serve_pod_log(request)
        if verb in ('list', 'watch'):
            av.parse_selector(request.params.get('labelSelector'))  # 400 on an invalid selector, before serving
        if verb == 'create' and not request.name:
            return await self._create(request, user)
        if verb in ('patch', 'update') and request.name:
            return await self._update(request, user, verb)
        if verb == 'delete':
            return await self._delete(request)
        return await super()._handle(request)

    def _authenticate(self, request: rendering.Request) -> str | None:
        """The bearer token's user (k8s.io/apiserver/pkg/authentication/request/bearertoken); ``None``: 401."""
        if not self.tokens:
            return rbac.ADMIN_USER
        auth = request.headers.get('Authorization', '')
        token = auth[7:].strip() if auth.lower().startswith('bearer ') else ''
        return self.tokens.get(token)

    def _attributes(self, request: rendering.Request, user: str, verb: str) -> rbac.Attributes:
        res = request.resource
        if res is None or res.plural is None:
            return rbac.Attributes(user=user, verb=verb, path=request.url.path, resource_request=False)
        return rbac.Attributes(user=user, verb=verb, group=res.group or '', resource=res.plural,
                               subresource=request.subresource or '', namespace=request.namespace or '',
                               name=request.name or '', path=request.url.path)

    def _rbac_objects(self) -> list[dict]:
        return [obj.raw for (res, _ns, _name), obj in list(self._objects.items())
                if res.group == 'rbac.authorization.k8s.io' and not obj.deleted]

    def check(self, a: rbac.Attributes) -> bool:
        """Authorize ``a`` against the stored RBAC objects, recording the decision of an audited user."""
        allowed, rule = rbac.authorize(a, self._rbac_objects())
        if a.user in self.audited:
            self.decisions.append(rbac.Decision(a.verb, a.group, a.resource, a.subresource, a.namespace, a.name,
                                                allowed, rule, '' if a.resource_request else a.path).as_dict())
        return allowed

    def _authorize(self, request: rendering.Request, user: str, verb: str) -> aiohttp.web.Response | None:
        """RBAC (k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac): 403 Forbidden in the API server's words."""
        a = self._attributes(request, user, verb)
        if self.check(a):
            return None
        details = {'name': a.name, 'group': a.group, 'kind': a.resource} if a.resource_request else None
        return _status(403, 'Forbidden', a.forbidden_message(), details=details)

    # --- test controls

    async def _control(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        if self._authenticate(request) != rbac.ADMIN_USER:
            return _status(403, 'Forbidden', 'test controls are the admin\'s')
        path, method = request.url.path, _method(request)
        if path == '/_test/faults' and method == 'POST':
            rules = request.data if isinstance(request.data, list) else [request.data]
            added = [Fault(id=next(self._fault_ids), **{k: v for k, v in r.items() if k not in ('id', 'hits')})
                     for r in rules]
            self.faults.extend(added)
            return aiohttp.web.json_response([attrs.asdict(f) for f in added], status=201)
        if path == '/_test/faults' and method == 'DELETE':
            self.faults.clear()
            return aiohttp.web.json_response({})
        if path == '/_test/faults':
            return aiohttp.web.json_response([attrs.asdict(f) for f in self.faults])
        if path == '/_test/authz' and method == 'DELETE':
            self.decisions.clear()
            return aiohttp.web.json_response({})
        if path == '/_test/authz':
            return aiohttp.web.json_response(self.decisions)
        return _status(404, 'NotFound', f'no test control at {path}')

    # --- custom resource definitions

    def register_crd(self, crd: dict) -> None:
        """Serve the resource a CustomResourceDefinition defines, each served version with its schema and
        subresources (k8s.io/apiextensions-apiserver/pkg/apiserver: the CRD handler)."""
        spec, names = crd.get('spec') or {}, (crd.get('spec') or {}).get('names') or {}
        for version in spec.get('versions') or []:
            res = references.resource(group=spec['group'], version=version['name'], plural=names['plural'])
            if not version.get('served', True):
                continue
            self.resources[res] = kmock.ResourceInfo(
                kind=names.get('kind'), singular=names.get('singular') or names['plural'],
                namespaced=spec.get('scope', 'Namespaced') == 'Namespaced',
                verbs={'get', 'list', 'watch', 'create', 'update', 'patch', 'delete', 'deletecollection'},
                shortnames=set(names.get('shortNames') or []), categories=set(names.get('categories') or []),
                subresources=set((version.get('subresources') or {}).keys()))
            schema = (version.get('schema') or {}).get('openAPIV3Schema')
            if schema:
                self.schemas[res] = av.StructuralSchema(schema)
            else:
                self.schemas.pop(res, None)

    # --- what a write would store: prepare, validate, admit

    def _info(self, res: references.resource) -> Any:
        return self.resources[res]

    def _qualified(self, res: references.resource) -> str:
        return f'{res.plural}.{res.group}' if res.group else str(res.plural)

    def _prepare(self, res: references.resource, obj: dict, request: rendering.Request,
                 old: dict | None = None) -> list[str]:
        """Default and prune ``obj`` (custom resources: the CRD's schema; builtin kinds: unknown fields dropped), then
        validate it (metadata, then schema): :class:`apivalidation.APIError` 422 on the first failure. Returns the
        dropped fields (fieldValidation=Strict refuses them: 400)."""
        info = self._info(res)
        schema = self.schemas.get(res)
        kind = info.kind or str(res.plural).capitalize()
        if schema is not None:
            schema.default(obj)
            dropped = schema.prune(obj)
        elif res.group in ('kubeflow.org', 'trainer.kubeflow.org'):
            dropped = []  # no schema served for these CRDs: unknown fields preserved
        else:
            dropped = av.prune_builtin_unknown(kind, obj.get('apiVersion', ''), obj)
        if kind == 'Secret' and isinstance(obj.get('stringData'), dict):  # write-only: merged into data, encoded
            obj['data'] = {**(obj.get('data') or {}), **{k: base64.b64encode(str(v).encode()).decode()
                                                        for k, v in obj.pop('stringData').items()}}
        if dropped and request.params.get('fieldValidation') == 'Strict':
            raise av.BadRequest('strict decoding error: ' + ', '.join(f'unknown field "{d}"' for d in dropped))
        meta = obj.get('metadata') or {}
        rule = 'label' if kind == 'Namespace' else 'path' if kind in _PATH_SEGMENT_NAMED else 'subdomain'
        errors = self._meta_errors(meta, bool(info.namespaced), rule)
        if schema is not None:
            errors += schema.validate(obj, old)
        elif (validator := av.builtin_validator(kind, obj.get('apiVersion', ''))) is not None:
            errors += av.schema_errors(validator, obj)
        if errors:
            raise av.Invalid(kind, res.group or '', meta.get('name') or meta.get('generateName') or '', errors)
        return dropped

    @staticmethod
    def _meta_errors(meta: dict, namespaced: bool, rule: str) -> list[av.FieldError]:
        if rule != 'path':
            return av.validate_object_meta(meta, namespaced, rule)
        errs = [e for e in av.validate_object_meta({**meta, 'name': 'x'}, namespaced) if e.path != 'metadata.name']
        name = meta.get('name') or ''
        if not name:
            errs.append(av.FieldError('Required value', 'metadata.name', 'name or generateName is required'))
        elif name in ('.', '..') or '/' in name or '%' in name:
            errs.append(av.invalid('metadata.name', name, 'may not contain \'/\' or \'%\', or be \'.\' or \'..\''))
        return errs

    async def _admit(self, request: rendering.Request, user: str, operation: str, old: dict | None,
                     new: dict) -> None:
        """Admission, after validation: OwnerReferencesPermissionEnforcement, then the validating webhooks."""
        if self.enforce_owner_references and user != rbac.ADMIN_USER:
            self._check_owner_references(request, user, old, new)
        if request.subresource in (None, 'status'):  # a rule naming "plural/status" sees status writes
            await self._call_webhooks(request, user, operation, old, new)

    def _check_owner_references(self, request: rendering.Request, user: str, old: dict | None, new: dict) -> None:
        """OwnerReferencesPermissionEnforcement (k8s.io/kubernetes/plugin/pkg/admission/gc): setting
        blockOwnerDeletion on an owner reference needs ``update`` on the owner's ``finalizers`` subresource."""
        before = {(r.get('uid'), r.get('blockOwnerDeletion')) for r in ((old or {}).get('metadata') or {}).get(
            'ownerReferences') or []}
        for ref in (new.get('metadata') or {}).get('ownerReferences') or []:
            if not ref.get('blockOwnerDeletion') or (ref.get('uid'), True) in before:
                continue
            group, _, version = (ref.get('apiVersion') or '').rpartition('/')
            owner = next((r for r in self.resources if r.group == group and r.version == version
                          and self.resources[r].kind == ref.get('kind')), None)
            plural = owner.plural if owner is not None else (ref.get('kind') or '').lower() + 's'
            a = rbac.Attributes(user=user, verb='update', group=group, resource=str(plural), subresource='finalizers',
                                namespace=request.namespace or '', name=ref.get('name') or '')
            if not self.check(a):
                res = request.resource
                name = (new.get('metadata') or {}).get('name') or ''
                why = a.forbidden_message().split(' is forbidden: ', 1)[1]
                raise av.APIError(403, 'Forbidden', f'{self._qualified(res)} "{name}" is forbidden: cannot set '
                                  f'blockOwnerDeletion if an ownerReference refers to a resource you can\'t set '
                                  f'finalizers on: {why}')

    def _webhooks(self, request: rendering.Request, operation: str) -> list[dict]:
        res = request.resource
        wanted = res.plural if request.subresource is None else f'{res.plural}/{request.subresource}'
        out = []
        for (r, _ns, _name), obj in list(self._objects.items()):
            if obj.deleted or r.plural != 'validatingwebhookconfigurations':
                continue
            for hook in obj.raw.get('webhooks') or []:
                for rule in hook.get('rules') or []:
                    if (operation in rule.get('operations', []) or '*' in rule.get('operations', [])) and \
                            res.group in rule.get('apiGroups', []) and wanted in rule.get('resources', []):
                        out.append(hook)
                        break
        return out

    async def _call_webhooks(self, request: rendering.Request, user: str, operation: str, old: dict | None,
                             new: dict) -> None:
        """Call the matching validating webhooks (``clientConfig.url``) as the API server does
        (k8s.io/apiserver/pkg/admission/plugin/webhook/validating): each within its ``timeoutSeconds`` (default 10),
        a failed call refused or ignored by its ``failurePolicy`` (default Fail)."""
        res = request.resource
        info = self._info(res)
        gvk = {'group': res.group, 'version': res.version, 'kind': info.kind or ''}
        gvr = {'group': res.group, 'version': res.version, 'resource': res.plural}
        for hook in self._webhooks(request, operation):
            review = {'apiVersion': 'admission.k8s.io/v1', 'kind': 'AdmissionReview', 'request': {
                'uid': str(uuid.uuid4()), 'operation': operation, 'subResource': request.subresource,
                'name': request.name or new.get('metadata', {}).get('name'), 'namespace': request.namespace,
                'kind': gvk, 'resource': gvr, 'requestKind': gvk, 'requestResource': gvr,
                'userInfo': {'username': user, 'groups': list(rbac.groups_of(user))},
                'object': new, 'oldObject': old, 'dryRun': False}}
            url = hook['clientConfig']['url']
            timeout = hook.get('timeoutSeconds') or _WEBHOOK_TIMEOUT_DEFAULT
            try:
                async with aiohttp.ClientSession() as session, session.post(
                        url, json=review, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    answer = (await resp.json())['response']
            except Exception as err:  # noqa: BLE001 - like the API server: the failure policy decides
                if hook.get('failurePolicy', 'Fail') == 'Ignore':
                    continue
                why = 'context deadline exceeded' if isinstance(err, TimeoutError) else str(err) or repr(err)
                raise av.APIError(500, 'InternalError', f'Internal error occurred: failed calling webhook '
                                  f'"{hook.get("name")}": failed to call webhook: Post "{url}": {why}') from None
            self.admissions.append((operation, res.plural, request.name, bool(answer.get('allowed'))))
            if not answer.get('allowed'):
                st = answer.get('status') or {}
                code = int(st.get('code') or 403)
                raise av.APIError(code, 'Forbidden' if code == 403 else 'Invalid',
                                  f'admission webhook "{hook.get("name")}" denied the request: {st.get("message", "")}')

    # --- writes

    def _key(self, request: rendering.Request, name: str) -> tuple:
        info = self._info(request.resource)
        return (request.resource, request.namespace if info.namespaced else None, name)

    def _current(self, key: tuple) -> dict | None:
        if key in self._objects and not self._objects[key].deleted:
            return copy.deepcopy(self._objects[key].raw)
        return None

    def _typed(self, res: references.resource, obj: dict) -> dict:
        """apiVersion and kind from the URL where the body leaves them out (the decoder's defaults)."""
        obj.setdefault('apiVersion', f'{res.group}/{res.version}' if res.group else str(res.version))
        obj.setdefault('kind', self._info(res).kind or str(res.plural).capitalize())
        return obj

    async def _create(self, request: rendering.Request, user: str) -> aiohttp.web.StreamResponse:
        res, info = request.resource, self._info(request.resource)
        if not isinstance(request.data, dict):
            raise av.BadRequest('the body of the request was in an unknown format')
        obj = self._typed(res, copy.deepcopy(request.data))
        meta = obj.setdefault('metadata', {})
        if not isinstance(meta, dict):
            raise av.BadRequest('metadata must be an object')
        if info.namespaced:
            if meta.get('namespace') and request.namespace and meta['namespace'] != request.namespace:
                raise av.BadRequest('the namespace of the provided object does not match the namespace sent on the '
                                    'request')
            meta['namespace'] = request.namespace or meta.get('namespace')
        else:
            meta.pop('namespace', None)  # a cluster-scoped object has none
        if not meta.get('name') and meta.get('generateName'):  # names.SimpleNameGenerator: 5 random characters
            meta['name'] = meta['generateName'] + uuid.uuid4().hex[:5]
        if 'status' in info.subresources:  # PrepareForCreate: a create cannot set the status
            obj.pop('status', None)
            if res.plural == 'pods' and res.group == '':
                obj['status'] = {'phase': 'Pending'}
        for k in ('resourceVersion', 'uid', 'creationTimestamp', 'deletionTimestamp', 'generation'):
            meta.pop(k, None)
        dropped = self._prepare(res, obj, request)
        await self._admit(request, user, 'CREATE', None, obj)
        key = self._key(request, meta['name'])
        async with self._lock:
            if self._current(key) is not None:
                raise av.APIError(409, 'AlreadyExists', f'{self._qualified(res)} "{meta["name"]}" already exists',
                                  {'name': meta['name'], 'group': res.group, 'kind': res.plural})
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1,
                        resourceVersion=self._next_rv())
            if key in self._objects:
                self._objects[key].create(obj)
            else:
                self._objects[key] = obj
            raw = self._objects[key].raw
            await self._buses[res].put({'type': 'ADDED', 'object': raw})
        self._stored(res, raw)
        return aiohttp.web.json_response(raw, status=201, headers=self._warnings(dropped))

    @staticmethod
    def _warnings(dropped: list[str]) -> dict[str, str] | None:
        if not dropped:
            return None
        return {'Warning': ', '.join(f'299 - "unknown field \\"{d}\\""' for d in dropped)}

    def _stored(self, res: references.resource, raw: dict) -> None:
        if res.group == 'apiextensions.k8s.io' and res.plural == 'customresourcedefinitions':
            self.register_crd(raw)

    def _apply(self, request: rendering.Request, old: dict, verb: str) -> dict:
        """The object a PATCH or PUT asks for, before the server's own rules."""
        res = request.resource
        if verb == 'update':
            if not isinstance(request.data, dict):
                raise av.BadRequest('the body of the request was in an unknown format')
            new = self._typed(res, copy.deepcopy(request.data))
            sent = (new.get('metadata') or {}).get('name')
            if sent and sent != request.name:
                raise av.BadRequest('the name of the object does not match the name on the URL')
            return new
        if isinstance(request.data, list):  # JSON patch (RFC 6902): a failed `test` is a conflict of versions
            try:
                return jsonpatch.apply_patch(old, request.data)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as e:
                raise av.APIError(422, 'Invalid', str(e)) from None
        if isinstance(request.data, dict):  # merge patch; strategic merge treated as merge
            return _merge_patch(old, request.data)
        raise av.BadRequest('the body of the request was in an unknown format')

    def _server_rules(self, request: rendering.Request, old: dict, new: dict, verb: str) -> dict:
        """What the server keeps of the old object: identity and system metadata, the status on the main resource and
        everything but the status on ``/status`` (where a status subresource exists), and the finalizers rule."""
        res, info = request.resource, self._info(request.resource)
        sent_rv = (new.get('metadata') or {}).get('resourceVersion')
        if sent_rv and sent_rv != old['metadata'].get('resourceVersion'):  # the write's precondition
            raise av.APIError(409, 'Conflict', f'Operation cannot be fulfilled on {self._qualified(res)} '
                              f'"{request.name}": the object has been modified; please apply your changes to the '
                              'latest version and try again')
        if request.subresource == 'status' and 'status' in info.subresources:
            status = new.get('status')
            new = copy.deepcopy(old)
            if status is None:
                new.pop('status', None)
            else:
                new['status'] = status
        elif request.subresource is None and 'status' in info.subresources:
            new = {k: v for k, v in new.items() if k != 'status'}
            if 'status' in old:
                new['status'] = copy.deepcopy(old['status'])
        meta = new.setdefault('metadata', {})
        if not isinstance(meta, dict):
            raise av.BadRequest('metadata must be an object')
        for k in ('name', 'namespace', 'uid', 'creationTimestamp', 'deletionTimestamp', 'generation',
                  'resourceVersion'):
            if k in old['metadata']:
                meta[k] = old['metadata'][k]
            else:
                meta.pop(k, None)
        if old['metadata'].get('deletionTimestamp'):
            added = set(meta.get('finalizers') or []) - set(old['metadata'].get('finalizers') or [])
            if added:
                raise av.Invalid(info.kind or '', res.group or '', request.name, [av.FieldError(
                    'Forbidden', 'metadata.finalizers', 'no new finalizers can be added if the object is being '
                    'deleted, found new finalizers ' + str(sorted(added)).replace("'", '"'))])
        return new

    async def _update(self, request: rendering.Request, user: str, verb: str) -> aiohttp.web.StreamResponse:
        """PATCH and PUT: retried on a concurrent write, as the registry's GuaranteedUpdate does."""
        res = request.resource
        key = self._key(request, request.name)
        for _ in range(20):
            old = self._current(key)
            if old is None:
                return _status(404, 'NotFound', f'{self._qualified(res)} "{request.name}" not found',
                               details={'name': request.name, 'group': res.group, 'kind': res.plural})
            new = self._server_rules(request, old, self._apply(request, copy.deepcopy(old), verb), verb)
            dropped = self._prepare(res, new, request, old)
            if _without(new, 'metadata') == _without(old, 'metadata') and new['metadata'] == old['metadata']:
                return aiohttp.web.json_response(old)  # a no-op write: not stored, no event, same version
            await self._admit(request, user, 'UPDATE', old, new)
            async with self._lock:
                current = self._current(key)
                if current is None or current['metadata'].get('resourceVersion') != \
                        old['metadata'].get('resourceVersion'):
                    continue  # written meanwhile: prepare again from the new version
                if _without(new, 'metadata', 'status') != _without(old, 'metadata', 'status'):
                    new['metadata']['generation'] = int(old['metadata'].get('generation') or 1) + 1
                new['metadata']['resourceVersion'] = self._next_rv()
                if new['metadata'].get('deletionTimestamp') and not new['metadata'].get('finalizers'):
                    self._objects[key].delete()  # the last finalizer removed: the object goes
                    await self._buses[res].put({'type': 'DELETED', 'object': new})
                    return aiohttp.web.json_response(new)
                self._objects[key].create(new)
                raw = self._objects[key].raw
                await self._buses[res].put({'type': 'MODIFIED', 'object': raw})
            self._stored(res, raw)
            return aiohttp.web.json_response(raw, headers=self._warnings(dropped))
        raise av.APIError(409, 'Conflict', f'Operation cannot be fulfilled on {self._qualified(res)} "{request.name}"')

    async def _delete(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        res = request.resource
        key = self._key(request, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                return _status(404, 'NotFound', f'{self._qualified(res)} "{request.name}" not found',
                               details={'name': request.name, 'group': res.group, 'kind': res.plural})
            obj = self._objects[key]
            meta = obj.raw.get('metadata', {})
            if meta.get('deletionTimestamp'):
                return aiohttp.web.json_response(obj.raw)
            if meta.get('finalizers'):
                raw = copy.deepcopy(obj.raw)
                raw['metadata'].update(deletionTimestamp=_now(), resourceVersion=self._next_rv())
                obj.create(raw)
                raw = obj.raw
                await self._buses[res].put({'type': 'MODIFIED', 'object': raw})
                return aiohttp.web.json_response(raw)
            raw = copy.deepcopy(obj.raw)
            raw['metadata']['resourceVersion'] = self._next_rv()
            obj.delete()
            await self._buses[res].put({'type': 'DELETED', 'object': raw})
            return aiohttp.web.json_response(raw)

    # --- reads

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

    async def _serve_list(self, request):
        rv = self._list_rv()
        result = await super()._serve_list(request)
        sel = av.parse_selector(request.params.get('labelSelector'))
        items = [o for o in result['items'] if match_labels(o.get('metadata', {}).get('labels') or {}, sel)]
        info = self.resources[request.resource]
        gv = f"{request.resource.group}/{request.resource.version}".lstrip('/')
        kind = info.kind or (request.resource.plural or '').capitalize()
        return {'apiVersion': gv, 'kind': f'{kind}List',
                'metadata': {'resourceVersion': rv}, 'items': items}

    def _visible(self, request, namespace, name, raw, selector) -> bool:
        return ((request.namespace is None or namespace == request.namespace)
                and (request.name is None or name == request.name)
                and match_labels(raw.get('metadata', {}).get('labels') or {}, selector))

    async def _serve_watch(self, request):
        selector = av.parse_selector(request.params.get('labelSelector'))
        yield b''
        since = request.params.get('resourceVersion') or '0'
        timeout = float(request.params.get('timeoutSeconds') or 0) or None
        deadline = None if timeout is None else time.monotonic() + timeout
        bus = self._buses[request.resource]
        async with self._lock:   # subscribe and snapshot atomically: no lost events
            marker = await bus.mark()
            snapshot = [obj.raw for (res, ns, name), obj in self._objects.items()
                        if res == request.resource and not obj.deleted
                        and self._visible(request, ns, name, obj.raw, selector)]
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
                if self._visible(request, meta.get('namespace'), meta.get('name'), event.get('object', {}), selector):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        # client-go's errors.IsAlreadyExists()/IsNotFound() need the standard Status reasons.
        from kmock._internal.k8s import KubernetesObjectConflictError
        if isinstance(exc, av.APIError):
            return _error(exc)
        if isinstance(exc, KubernetesObjectConflictError):
            exc = kmock.KubernetesError(status=409, reason='AlreadyExists', message=exc.message)
        elif isinstance(exc, kmock.KubernetesNotFoundError):
            exc = kmock.KubernetesError(status=404, reason='NotFound', message=exc.message)
        return await super()._render_error(exc)

    async def _serve_version(self, request):
        result = await super()._serve_version(request)
        result['groupVersion'] = result['groupVersion'].lstrip('/')
        return result
