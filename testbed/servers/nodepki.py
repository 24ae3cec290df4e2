"""Certificates for the test bed's node, issued by the control plane's CA (tests and demo only).

Role: a kubelet authenticates as ``system:node:<name>`` (group ``system:nodes``), so the Node authorizer
and NodeRestriction apply to it exactly as in a real cluster, and serves its own API (logs, exec, the
API server's probes of it) with a certificate for 127.0.0.1 and its name. The controller manager and the
scheduler get their well-known identities (``system:kube-controller-manager``, ``system:kube-scheduler``),
which the API server's bootstrap RBAC policy grants what they need; the API server gets a kubelet client
certificate. Keys are ECDSA P-256, written 0600 next to the control plane's PKI.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from testbed.servers.pki import Pki, certificate_builder, new_key, write_cert, write_key


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def _load_ca(pki: Pki) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{pki.ca_key} is not an ECDSA key")
    return cert, key


def issue(
    pki: Pki,
    directory: Path,
    name: str,
    *,
    common_name: str,
    organization: str | None = None,
    client: bool = True,
    server_names: tuple[str, ...] = (),
) -> Pair:
    """Write ``<name>.crt``/``<name>.key`` signed by the control plane's CA; return their paths."""
    ca_cert, ca_key = _load_ca(pki)
    key = new_key()
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    usages = ([ExtendedKeyUsageOID.CLIENT_AUTH] if client else []) + (
        [ExtendedKeyUsageOID.SERVER_AUTH] if server_names else []
    )
    builder = certificate_builder(x509.Name(attrs), ca_cert.subject, key.public_key(), days=30).add_extension(
        x509.ExtendedKeyUsage(usages), critical=False
    )
    if server_names:
        alt: list[x509.GeneralName] = []
        for n in server_names:
            try:
                alt.append(x509.IPAddress(ipaddress.ip_address(n)))
            except ValueError:
                alt.append(x509.DNSName(n))
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    write_cert(pair.cert, builder.sign(ca_key, hashes.SHA256()))
    write_key(pair.key, key)
    return pair


def apiserver_kubelet_client(pki: Pki) -> Pair:
    """The API server's client certificate towards kubelets (logs, exec, port-forward)."""
    return issue(
        pki,
        pki.ca_cert.parent,
        "apiserver-kubelet-client",
        common_name="kube-apiserver-kubelet-client",
        organization="system:masters",
    )
