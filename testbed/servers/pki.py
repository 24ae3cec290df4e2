"""Certificates for the local control plane (tests and demo only).

Writes, into one directory: a CA, a serving certificate for 127.0.0.1/localhost signed by it, an ECDSA
service-account signing key pair, and an admin client certificate (O=system:masters) that the written
kubeconfig uses. Everything is generated with ``cryptography``; nothing leaves the state directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pki:
    ca_cert: Path
    # Kept so the node of the test bed can issue its kubelets' and controllers' certificates.
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_public: Path
    sa_private: Path
    admin_cert: Path
    admin_key: Path

    @classmethod
    def in_directory(cls, directory: Path) -> Pki:
        """Where :func:`generate` writes each file in ``directory``; also how the node finds the CA again."""
        return cls(
            ca_cert=directory / "ca.crt",
            ca_key=directory / "ca.key",
            serving_cert=directory / "apiserver.crt",
            serving_key=directory / "apiserver.key",
            sa_public=directory / "sa.pub",
            sa_private=directory / "sa.key",
            admin_cert=directory / "admin.crt",
            admin_key=directory / "admin.key",
        )


def new_key() -> ec.EllipticCurvePrivateKey:
    """A fresh ECDSA P-256 key: every key of the test bed's PKI is one."""
    return ec.generate_private_key(ec.SECP256R1())


def write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by its owner only (0600)."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def write_cert(path: Path, cert: x509.Certificate) -> None:
    """Write ``cert`` as PEM."""
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def certificate_builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, *, days: int = 365
) -> x509.CertificateBuilder:
    """A certificate for ``public_key`` valid from five minutes ago (clock skew between processes) for ``days``."""
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


_KEY_USAGES = (
    "digital_signature",
    "content_commitment",
    "key_encipherment",
    "data_encipherment",
    "key_agreement",
    "key_cert_sign",
    "crl_sign",
    "encipher_only",
    "decipher_only",
)


def key_usage(*granted: str) -> x509.KeyUsage:
    """A KeyUsage extension granting exactly ``granted`` (cryptography wants every flag named)."""
    return x509.KeyUsage(**{name: name in granted for name in _KEY_USAGES})


def generate(directory: Path) -> Pki:
    """Create (or overwrite) the full set of files in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = new_key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "model-agent-dev-ca")])
    ca = (
        certificate_builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            key_usage("digital_signature", "key_cert_sign", "crl_sign"),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = new_key()
    serving = (
        certificate_builder(
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
            ca_name,
            serving_key.public_key(),
        )
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    admin_key = new_key()
    admin = (
        certificate_builder(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
                    x509.NameAttribute(NameOID.COMMON_NAME, "model-agent-dev-admin"),
                ]
            ),
            ca_name,
            admin_key.public_key(),
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = new_key()
    pki = Pki.in_directory(directory)
    write_cert(pki.ca_cert, ca)
    write_key(pki.ca_key, ca_key)
    write_cert(pki.serving_cert, serving)
    write_key(pki.serving_key, serving_key)
    write_cert(pki.admin_cert, admin)
    write_key(pki.admin_key, admin_key)
    write_key(pki.sa_private, sa_key)
    pki.sa_public.write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki
