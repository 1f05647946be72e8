"""Certificates and keys for a test control plane, made at start and never committed.

One CA signs the API server's serving certificate and one client certificate per identity (the
API server maps a client certificate's CN to the user and its O fields to groups). The service
account signing key is separate. ECDSA P-256 throughout: generated in milliseconds, and every
component (Go's crypto/tls, urllib3, aiohttp) accepts it.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)
"""How long every certificate is valid (a test session lasts minutes)."""


@dataclass(frozen=True)
class KeyPair:
    """Paths of a PEM certificate and its PEM private key."""

    cert: Path
    key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(folder: Path, stem: str, key: ec.EllipticCurvePrivateKey,
           cert: x509.Certificate) -> KeyPair:
    pair = KeyPair(folder / f"{stem}.crt", folder / f"{stem}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    pair.key.chmod(0o600)
    return pair


def _builder(subject: x509.Name, issuer: x509.Name,
             public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + VALIDITY))


class Authority:
    """A CA that writes its certificate and key, and signs serving and client certificates
    into ``folder``."""

    def __init__(self, folder: Path, name: str = "tailguard-test-ca") -> None:
        self.folder = folder
        self._key = _key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (_builder(self._name, self._name, self._key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, key_cert_sign=True, crl_sign=True,
                    content_commitment=False, key_encipherment=False, data_encipherment=False,
                    key_agreement=False, encipher_only=False, decipher_only=False),
                    critical=True)
                .sign(self._key, hashes.SHA256()))
        self.pair = _write(folder, "ca", self._key, cert)

    def serving(self, stem: str, *, dns: list[str], ips: list[str]) -> KeyPair:
        """A server certificate valid for the names ``dns`` and addresses ``ips``."""
        key = _key()
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (_builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0])]),
                         self._name, key.public_key())
                .add_extension(x509.SubjectAlternativeName(names), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                               critical=False)
                .sign(self._key, hashes.SHA256()))
        return _write(self.folder, stem, key, cert)

    def client(self, stem: str, *, user: str, groups: tuple[str, ...] = ()) -> KeyPair:
        """A client certificate the API server reads as ``user`` in ``groups``."""
        key = _key()
        subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
                             x509.NameAttribute(NameOID.COMMON_NAME, user)])
        cert = (_builder(subject, self._name, key.public_key())
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(self._key, hashes.SHA256()))
        return _write(self.folder, stem, key, cert)


def signing_key(folder: Path, stem: str = "service-account") -> KeyPair:
    """The service account token signing key: ``key`` private (PKCS#8), ``cert`` holds the
    public key (PEM), as ``--service-account-key-file`` takes it."""
    key = _key()
    pair = KeyPair(folder / f"{stem}.pub", folder / f"{stem}.key")
    pair.key.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    pair.key.chmod(0o600)
    pair.cert.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pair
