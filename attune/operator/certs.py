"""The admission webhook's self-signed certificates, kept by the operator itself when cert-manager is not used.

At start-up the operator reads the Secret holding its CA and serving pair (``ca.crt``, ``ca.key``, ``tls.crt``,
``tls.key``) in its own namespace, creates it when absent, reuses it while valid, and rotates it when a certificate is
within :data:`RENEW_BEFORE` of expiry, its DNS names differ from the Service's, or the pieces do not fit together. It
then writes the serving pair where the webhook server reads it and patches the ``caBundle`` of the chart's
ValidatingWebhookConfiguration. The chart therefore renders the same manifests every time (nothing random, no
``lookup``), which GitOps tools need.

A serving certificate is re-issued from the same CA when only it needs renewing, so the ``caBundle`` does not change.
When the CA itself is replaced, the bundle holds the new CA and the previous one while it is valid, so a replica still
serving the old pair (during a rolling update) stays trusted.

The pure parts (:func:`new_ca`, :func:`new_serving`, :func:`rotation_reason`, :func:`plan_bundle`,
:func:`ca_bundle_patch`) need no cluster; :func:`ensure` runs them against a :class:`CertApi`.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

log = logging.getLogger(__name__)

CA_VALIDITY = dt.timedelta(days=3650)
SERVING_VALIDITY = dt.timedelta(days=365)
#: a certificate closer than this to its expiry is replaced at start-up
RENEW_BEFORE = dt.timedelta(days=30)
#: tolerated clock skew between the operator and the API server
_BACKDATE = dt.timedelta(minutes=5)
KEYS = ("ca.crt", "ca.key", "tls.crt", "tls.key")


class CertError(RuntimeError):
    """The certificates cannot be kept: the message says what to fix."""


@dataclass(frozen=True)
class CertPlan:
    """Where the operator keeps the webhook's certificates (from ``attune operator run``'s flags)."""

    secret_name: str
    namespace: str
    service: str
    cert_file: str
    key_file: str
    webhook_config: str | None = None
    #: further names the API server may dial the webhook at (``--webhook-host``: an operator outside the cluster,
    #: reached through a URL-mode client configuration); an IP address becomes an IP entry of the certificate
    hosts: tuple[str, ...] = ()

    @property
    def dns_names(self) -> list[str]:
        """Every name of the serving certificate: the Service's, then ``hosts``."""
        return [f"{self.service}.{self.namespace}.svc", f"{self.service}.{self.namespace}.svc.cluster.local",
                *self.hosts]


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@dataclass(frozen=True)
class Bundle:
    """The PEM texts kept in the Secret; ``ca_crt`` may hold the previous CA after the current one."""

    ca_crt: bytes
    ca_key: bytes
    tls_crt: bytes
    tls_key: bytes

    def secret_data(self) -> dict[str, str]:
        return {k: base64.b64encode(v).decode() for k, v in zip(KEYS, (self.ca_crt, self.ca_key, self.tls_crt,
                                                                       self.tls_key), strict=True)}

    @classmethod
    def from_secret(cls, secret: dict[str, Any] | None) -> Bundle | None:
        """The bundle a Secret holds; None when it is absent or lacks a key."""
        data = (secret or {}).get("data") or {}
        if not all(data.get(k) for k in KEYS):
            return None
        try:
            return cls(*(base64.b64decode(data[k]) for k in KEYS))
        except ValueError:
            return None


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def new_ca(common_name: str, now: dt.datetime, validity: dt.timedelta = CA_VALIDITY) -> tuple[bytes, bytes]:
    """A self-signed CA: (certificate PEM, private key PEM)."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def new_serving(ca_crt: bytes, ca_key: bytes, dns_names: list[str], now: dt.datetime,
                validity: dt.timedelta = SERVING_VALIDITY, ip_addresses: Sequence[str] = ()) -> tuple[bytes, bytes]:
    """A serving certificate for ``dns_names`` (and ``ip_addresses``, for a server reached by address, such as a
    webhook registered by URL on 127.0.0.1) signed by the CA (the first certificate of ``ca_crt``), never outliving
    it: (certificate PEM, private key PEM)."""
    ca = x509.load_pem_x509_certificates(ca_crt)[0]
    signer = serialization.load_pem_private_key(ca_key, password=None)
    if not isinstance(signer, ec.EllipticCurvePrivateKey):
        raise CertError("the CA key in the Secret is not an EC key")
    key = _key()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]))
            .issuer_name(ca.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(min(now + validity, ca.not_valid_after_utc))
            .add_extension(x509.SubjectAlternativeName([*(_san(n) for n in dns_names),
                                                        *(_san(a) for a in ip_addresses)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
            .sign(signer, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def _public(obj: Any) -> bytes:
    return bytes(obj.public_key().public_bytes(serialization.Encoding.DER,
                                               serialization.PublicFormat.SubjectPublicKeyInfo))


def _ca_reason(bundle: Bundle, now: dt.datetime, renew_before: dt.timedelta) -> str | None:
    try:
        ca = x509.load_pem_x509_certificates(bundle.ca_crt)[0]
        key = serialization.load_pem_private_key(bundle.ca_key, password=None)
    except ValueError:
        return "the CA is unreadable"
    if _public(ca) != _public(key):
        return "the CA key does not match the CA certificate"
    if ca.not_valid_after_utc - renew_before <= now:
        return f"the CA expires {ca.not_valid_after_utc:%Y-%m-%d}"
    return None


def rotation_reason(bundle: Bundle | None, dns_names: list[str], now: dt.datetime,
                    renew_before: dt.timedelta = RENEW_BEFORE) -> str | None:
    """Why the bundle must be (partly) replaced; None when it may be reused as is."""
    if bundle is None:
        return "no certificate yet"
    reason = _ca_reason(bundle, now, renew_before)
    if reason:
        return reason
    try:
        ca = x509.load_pem_x509_certificates(bundle.ca_crt)[0]
        cert = x509.load_pem_x509_certificate(bundle.tls_crt)
        key = serialization.load_pem_private_key(bundle.tls_key, password=None)
    except ValueError:
        return "the serving certificate is unreadable"
    if _public(cert) != _public(key):
        return "the serving key does not match its certificate"
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as err:
        return f"the serving certificate is not signed by the CA ({type(err).__name__})"
    if cert.not_valid_after_utc - renew_before <= now:
        return f"the serving certificate expires {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_before_utc > now + _BACKDATE:
        return "the serving certificate is not valid yet"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*san.get_values_for_type(x509.DNSName), *(str(ip) for ip in san.get_values_for_type(x509.IPAddress))]
    except x509.ExtensionNotFound:
        names = []
    if sorted(names) != sorted(dns_names):
        return f"the names changed ({', '.join(sorted(names)) or 'none'} -> {', '.join(sorted(dns_names))})"
    return None


def plan_bundle(existing: Bundle | None, dns_names: list[str], common_name: str, now: dt.datetime,
                renew_before: dt.timedelta = RENEW_BEFORE) -> tuple[Bundle, str | None]:
    """The bundle to use and why it changed (None: ``existing`` as is). A valid CA is kept (only the serving pair
    is re-issued); a replaced CA is followed in ``ca.crt`` by the previous one while that one is still valid."""
    reason = rotation_reason(existing, dns_names, now, renew_before)
    if reason is None and existing is not None:
        return existing, None
    if existing is not None and _ca_reason(existing, now, renew_before) is None:
        ca_crt, ca_key = existing.ca_crt, existing.ca_key
    else:
        ca_crt, ca_key = new_ca(common_name, now)
        if existing is not None:
            ca_crt += b"".join(_still_valid(existing.ca_crt, now, limit=1))
    tls_crt, tls_key = new_serving(ca_crt, ca_key, dns_names, now)
    return Bundle(ca_crt, ca_key, tls_crt, tls_key), reason


def _still_valid(pem: bytes, now: dt.datetime, limit: int) -> list[bytes]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []
    return [c.public_bytes(serialization.Encoding.PEM) for c in certs[:limit] if c.not_valid_after_utc > now]


def ca_bundle_patch(config: dict[str, Any], ca_pem: bytes) -> dict[str, Any] | None:
    """The strategic-merge patch (webhooks merge by name) setting every webhook's ``clientConfig.caBundle`` of a
    ValidatingWebhookConfiguration to ``ca_pem``; None when every one already has it."""
    value = base64.b64encode(ca_pem).decode()
    hooks = config.get("webhooks") or []
    if all((h.get("clientConfig") or {}).get("caBundle") == value for h in hooks):
        return None
    return {"webhooks": [{"name": h["name"], "clientConfig": {"caBundle": value}} for h in hooks]}


def secret_body(plan: CertPlan, bundle: Bundle, resource_version: str | None = None) -> dict[str, Any]:
    """The Secret holding ``bundle`` (with ``resource_version``: a patch that fails if someone wrote it meanwhile)."""
    meta: dict[str, Any] = {"name": plan.secret_name, "namespace": plan.namespace,
                            "labels": {"app.kubernetes.io/name": "attune",
                                       "app.kubernetes.io/component": "webhook-certificate",
                                       "app.kubernetes.io/managed-by": "attune-operator"}}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "kubernetes.io/tls",
            "data": bundle.secret_data()}


class CertApi(Protocol):
    """The four API calls :func:`ensure` makes. ``create_secret`` and ``patch_secret`` return False on a conflict
    (409: another replica wrote first); every call raises :class:`CertError` on a refusal, naming the permission."""

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool: ...

    def patch_secret(self, namespace: str, name: str, body: dict[str, Any]) -> bool: ...

    def read_webhook_config(self, name: str) -> dict[str, Any] | None: ...

    def patch_webhook_config(self, name: str, body: dict[str, Any]) -> None: ...


def ensure(plan: CertPlan, api: CertApi, now: dt.datetime | None = None, attempts: int = 3) -> Bundle:
    """Keep the Secret (create, reuse or rotate), write the serving pair to the files, and patch the caBundle."""
    for _ in range(attempts):
        now = now or dt.datetime.now(dt.UTC)
        secret = api.read_secret(plan.namespace, plan.secret_name)
        existing = Bundle.from_secret(secret)
        bundle, reason = plan_bundle(existing, plan.dns_names, f"{plan.service}.{plan.namespace} webhook CA", now)
        if reason is None:
            log.info("webhook certificate: reusing Secret %s/%s", plan.namespace, plan.secret_name)
            break
        if secret is None:
            ok = api.create_secret(plan.namespace, secret_body(plan, bundle))
        else:
            ok = api.patch_secret(plan.namespace, plan.secret_name,
                                  secret_body(plan, bundle, (secret.get("metadata") or {}).get("resourceVersion")))
        if ok:
            log.info("webhook certificate: wrote Secret %s/%s (%s)", plan.namespace, plan.secret_name, reason)
            break
        log.info("webhook certificate: another replica wrote Secret %s/%s first; reading it", plan.namespace,
                 plan.secret_name)
    else:
        raise CertError(f"Secret {plan.namespace}/{plan.secret_name} kept changing under the operator "
                        f"({attempts} attempts)")
    write_files(plan, bundle)
    if plan.webhook_config:
        config = api.read_webhook_config(plan.webhook_config)
        if config is None:
            raise CertError(f"ValidatingWebhookConfiguration {plan.webhook_config} not found: install the chart "
                            "with webhook.enabled=true, or drop --webhook-config")
        patch = ca_bundle_patch(config, bundle.ca_crt)
        if patch is not None:
            api.patch_webhook_config(plan.webhook_config, patch)
            log.info("webhook certificate: caBundle of %s updated", plan.webhook_config)
    return bundle


def write_files(plan: CertPlan, bundle: Bundle) -> None:
    """Write the serving pair atomically (the key readable by this user only)."""
    for path, data, mode in ((plan.cert_file, bundle.tls_crt, 0o644), (plan.key_file, bundle.tls_key, 0o600)):
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class KubeCertApi:
    """:class:`CertApi` through the official ``kubernetes`` client."""

    def __init__(self, api: Any | None = None) -> None:
        from kubernetes import client

        from attune.operator.kube import api_client

        self.api = api or api_client()
        self.core = client.CoreV1Api(self.api)
        self.admission = client.AdmissionregistrationV1Api(self.api)

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        import json

        return dict(json.loads(resp.data))

    def _call(self, what: str, verb: str, resource: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        from attune.operator.kube import api_message

        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as err:
            if err.status in (404, 409):
                return err.status
            reason, message = api_message(err)
            if err.status == 403:
                raise CertError(f"forbidden to {verb} {what}: the operator's ServiceAccount needs '{verb}' on "
                                f"{resource} (the chart grants it with webhook.certManager.enabled=false); "
                                f"{message}") from None
            raise CertError(f"cannot {verb} {what}: {err.status} {reason} {message}".rstrip()) from None

    def read_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        r = self._call(f"Secret {namespace}/{name}", "get", f"secrets/{name} in {namespace}",
                       self.core.read_namespaced_secret, name, namespace)
        return None if r == 404 else self._json(r)

    def create_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        name = body["metadata"]["name"]
        r = self._call(f"Secret {namespace}/{name}", "create", f"secrets in {namespace}",
                       self.core.create_namespaced_secret, namespace, body)
        return r != 409

    def patch_secret(self, namespace: str, name: str, body: dict[str, Any]) -> bool:
        r = self._call(f"Secret {namespace}/{name}", "patch", f"secrets/{name} in {namespace}",
                       self.core.patch_namespaced_secret, name, namespace, body,
                       _content_type="application/merge-patch+json")
        if r == 404:
            raise CertError(f"Secret {namespace}/{name} disappeared while the operator rotated it")
        return r != 409

    def read_webhook_config(self, name: str) -> dict[str, Any] | None:
        r = self._call(f"ValidatingWebhookConfiguration {name}", "get",
                       f"validatingwebhookconfigurations/{name}",
                       self.admission.read_validating_webhook_configuration, name)
        return None if r in (404, 409) else self._json(r)

    def patch_webhook_config(self, name: str, body: dict[str, Any]) -> None:
        r = self._call(f"ValidatingWebhookConfiguration {name}", "patch",
                       f"validatingwebhookconfigurations/{name}",
                       self.admission.patch_validating_webhook_configuration, name, body,
                       _content_type="application/strategic-merge-patch+json")
        if r in (404, 409):
            raise CertError(f"cannot patch ValidatingWebhookConfiguration {name}: {r}")
