"""The webhook's self-signed certificates kept by the operator (attune/operator/certs.py), without a cluster: what is
generated, when it is rotated, the caBundle patch, and the Secret dance with a second replica (an in-memory API)."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import ssl

import pytest

pytest.importorskip("cryptography")
from cryptography import x509  # noqa: E402

from attune.operator import certs  # noqa: E402

pytestmark = pytest.mark.k8s
NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
DNS = ["rel-attune.attune-system.svc", "rel-attune.attune-system.svc.cluster.local"]


def fresh(now=NOW) -> certs.Bundle:
    bundle, reason = certs.plan_bundle(None, DNS, "test CA", now)
    assert reason == "no certificate yet"
    return bundle


def test_generated_pair_is_a_ca_and_a_serving_certificate_for_the_service(tmp_path):
    b = fresh()
    [ca] = x509.load_pem_x509_certificates(b.ca_crt)
    tls = x509.load_pem_x509_certificate(b.tls_crt)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert tls.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert tls.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.DNSName) == DNS
    tls.verify_directly_issued_by(ca)
    assert tls.not_valid_after_utc <= ca.not_valid_after_utc
    # what the webhook server does with the files: an SSL context loads them
    (tmp_path / "tls.crt").write_bytes(b.tls_crt)
    (tmp_path / "tls.key").write_bytes(b.tls_key)
    ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    assert certs.rotation_reason(b, DNS, NOW) is None


def test_rotation_decisions():
    b = fresh()
    assert certs.plan_bundle(b, DNS, "test CA", NOW + dt.timedelta(days=100)) == (b, None)  # reused while valid
    # the serving certificate within 30 days of expiry: re-issued from the same CA (the caBundle stays)
    late = NOW + certs.SERVING_VALIDITY - dt.timedelta(days=29)
    assert "serving certificate expires" in certs.rotation_reason(b, DNS, late)
    renewed, reason = certs.plan_bundle(b, DNS, "test CA", late)
    assert reason and renewed.ca_crt == b.ca_crt and renewed.tls_crt != b.tls_crt
    assert certs.rotation_reason(renewed, DNS, late) is None
    # other DNS names (another release or namespace)
    assert "names changed" in certs.rotation_reason(b, ["other.ns.svc", "other.ns.svc.cluster.local"], NOW)
    # the CA within 30 days of expiry: a new CA, the old one kept in the bundle while it is valid
    ca_late = NOW + certs.CA_VALIDITY - dt.timedelta(days=10)
    assert "CA expires" in certs.rotation_reason(b, DNS, ca_late)
    rotated, _ = certs.plan_bundle(b, DNS, "test CA", ca_late)
    chain = x509.load_pem_x509_certificates(rotated.ca_crt)
    assert len(chain) == 2 and chain[1] == x509.load_pem_x509_certificate(b.ca_crt)
    x509.load_pem_x509_certificate(rotated.tls_crt).verify_directly_issued_by(chain[0])
    # pieces that do not fit together
    other = fresh()
    assert "not signed by the CA" in certs.rotation_reason(certs.Bundle(other.ca_crt, other.ca_key, b.tls_crt,
                                                                        b.tls_key), DNS, NOW)
    assert "does not match" in certs.rotation_reason(certs.Bundle(b.ca_crt, b.ca_key, b.tls_crt, other.tls_key),
                                                     DNS, NOW)
    assert "unreadable" in certs.rotation_reason(certs.Bundle(b"junk", b.ca_key, b.tls_crt, b.tls_key), DNS, NOW)
    assert certs.Bundle.from_secret({"data": {"tls.crt": "eA=="}}) is None


def test_ca_bundle_patch_sets_every_webhook_once():
    config = {"metadata": {"name": "rel-attune-gate"},
              "webhooks": [{"name": "validate-trial.attune.dev", "clientConfig": {"service": {"name": "x"}}},
                           {"name": "validate-run.attune.dev", "clientConfig": {"service": {"name": "x"}}}]}
    patch = certs.ca_bundle_patch(config, b"PEM")
    value = base64.b64encode(b"PEM").decode()
    assert patch == {"webhooks": [{"name": "validate-trial.attune.dev", "clientConfig": {"caBundle": value}},
                                  {"name": "validate-run.attune.dev", "clientConfig": {"caBundle": value}}]}
    for hook in config["webhooks"]:
        hook["clientConfig"]["caBundle"] = value
    assert certs.ca_bundle_patch(config, b"PEM") is None


class FakeApi:
    """An API server holding one Secret and one webhook configuration; ``race`` lets another replica write the
    Secret between this replica's read and write."""

    def __init__(self):
        self.secrets: dict[tuple[str, str], dict] = {}
        self.configs = {"rel-attune-gate": {"webhooks": [{"name": "validate-run.attune.dev", "clientConfig": {}}]}}
        self.race: certs.Bundle | None = None
        self.version = 0
        self.calls: list[str] = []

    def _store(self, ns, body):
        self.version += 1
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = str(self.version)
        self.secrets[(ns, body["metadata"]["name"])] = body

    def _interfere(self, ns, name):
        if self.race is not None:
            plan = certs.CertPlan(name, ns, "rel-attune", "/x", "/y")
            self._store(ns, certs.secret_body(plan, self.race))
            self.race = None
            return True
        return False

    def read_secret(self, namespace, name):
        self.calls.append("get secret")
        return copy.deepcopy(self.secrets.get((namespace, name)))

    def create_secret(self, namespace, body):
        self.calls.append("create secret")
        if self._interfere(namespace, body["metadata"]["name"]) or (namespace, body["metadata"]["name"]) in \
                self.secrets:
            return False
        self._store(namespace, body)
        return True

    def patch_secret(self, namespace, name, body):
        self.calls.append("patch secret")
        self._interfere(namespace, name)
        if body["metadata"].get("resourceVersion") != self.secrets[(namespace, name)]["metadata"]["resourceVersion"]:
            return False
        self._store(namespace, body)
        return True

    def read_webhook_config(self, name):
        self.calls.append("get vwc")
        return copy.deepcopy(self.configs.get(name))

    def patch_webhook_config(self, name, body):
        self.calls.append("patch vwc")
        for hook in self.configs[name]["webhooks"]:
            for h in body["webhooks"]:
                if h["name"] == hook["name"]:
                    hook["clientConfig"].update(h["clientConfig"])


def plan(tmp_path, webhook_config="rel-attune-gate"):
    return certs.CertPlan("rel-attune-webhook-tls", "attune-system", "rel-attune", str(tmp_path / "certs/tls.crt"),
                          str(tmp_path / "certs/tls.key"), webhook_config)


def test_ensure_creates_reuses_and_patches_the_ca_bundle(tmp_path):
    api, p = FakeApi(), plan(tmp_path)
    first = certs.ensure(p, api, NOW)
    assert api.calls == ["get secret", "create secret", "get vwc", "patch vwc"]
    assert (tmp_path / "certs/tls.crt").read_bytes() == first.tls_crt
    assert oct((tmp_path / "certs/tls.key").stat().st_mode & 0o777) == "0o600"
    hook = api.configs["rel-attune-gate"]["webhooks"][0]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == first.ca_crt
    stored = api.secrets[("attune-system", "rel-attune-webhook-tls")]
    assert stored["type"] == "kubernetes.io/tls" and set(stored["data"]) == set(certs.KEYS)
    api.calls.clear()
    again = certs.ensure(p, api, NOW + dt.timedelta(days=1))  # a restart: the same pair, nothing written
    assert again == first and api.calls == ["get secret", "get vwc"]
    api.calls.clear()
    late = NOW + certs.SERVING_VALIDITY - dt.timedelta(days=5)
    renewed = certs.ensure(p, api, late)
    assert renewed.tls_crt != first.tls_crt and api.calls == ["get secret", "patch secret", "get vwc"]


def test_ensure_takes_the_other_replicas_secret_after_a_conflict(tmp_path):
    api, p = FakeApi(), plan(tmp_path)
    api.race = other = fresh()
    got = certs.ensure(p, api, NOW)
    assert got == other  # its create lost (409): it read and used the winner's pair
    assert api.calls[:3] == ["get secret", "create secret", "get secret"]
    # a rotation racing another replica's rotation: the patch carries resourceVersion, loses, re-reads
    late = NOW + certs.SERVING_VALIDITY - dt.timedelta(days=5)
    api.race, _ = certs.plan_bundle(other, DNS, "test CA", late)
    winner = api.race
    api.calls.clear()
    assert certs.ensure(p, api, late) == winner
    assert api.calls[:3] == ["get secret", "patch secret", "get secret"]


def test_ensure_names_a_missing_webhook_configuration(tmp_path):
    with pytest.raises(certs.CertError, match="ValidatingWebhookConfiguration nope not found"):
        certs.ensure(plan(tmp_path, "nope"), FakeApi(), NOW)


def test_serving_certificate_for_an_address_passes_a_tls_client_that_checks_it(tmp_path):
    """A webhook registered by URL on 127.0.0.1 (the real training operator's) is checked by IP address: the serving
    certificate carries it as an IP SAN, and a client that trusts only the CA and checks the name completes the
    handshake; one issued for the DNS names alone is refused."""
    import socket
    import threading

    ca_crt, ca_key = certs.new_ca("test CA", NOW)
    now = dt.datetime.now(dt.UTC)
    for ips, accepted in ((["127.0.0.1"], True), ([], False)):
        crt, key = certs.new_serving(ca_crt, ca_key, ["localhost"], now, ip_addresses=ips)
        (tmp_path / "tls.crt").write_bytes(crt)
        (tmp_path / "tls.key").write_bytes(key)
        cert = x509.load_pem_x509_certificate(crt)
        assert [str(a) for a in cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)] == ips
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        client_ctx = ssl.create_default_context(cadata=ca_crt.decode())
        left, right = socket.socketpair()
        server_error: list[BaseException] = []

        def serve(sock=left, ctx=server_ctx, errors=server_error):
            try:
                with ctx.wrap_socket(sock, server_side=True):
                    pass
            except (ssl.SSLError, OSError) as err:
                errors.append(err)

        thread = threading.Thread(target=serve)
        thread.start()
        try:
            with client_ctx.wrap_socket(right, server_hostname="127.0.0.1"):
                handshake_ok = True
        except ssl.SSLCertVerificationError as err:
            handshake_ok = False
            assert "IP address mismatch" in str(err)
        finally:
            right.close()
            thread.join(10)
            left.close()
        assert handshake_ok is accepted
