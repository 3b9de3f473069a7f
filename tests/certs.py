"""Test certificates (cryptography package), as PEM files: a CA, and leaf certificates it signs.

    ca = make_ca(tmp_path, "ca")
    cert, key = make_leaf(tmp_path, "broker", ca, ips=["127.0.0.1"], server=True)

Every key is an EC P-256 key; certificates are valid from five minutes ago for one day. Used by
the TLS tests of Kafka (tests/secure_kafka.py) and of the /metrics server.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclasses.dataclass(frozen=True)
class CertificateAuthority:
    """A CA: its certificate as a PEM file (what clients and servers trust) and its signing key."""

    cert: Path
    key: ec.EllipticCurvePrivateKey
    name: x509.Name


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _write_cert(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def make_ca(folder: Path, stem: str, common_name: str | None = None) -> CertificateAuthority:
    """A self-signed CA whose certificate is written to `folder/STEM.pem`."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(common_name or stem)
    cert = (
        _builder(name, name, key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return CertificateAuthority(_write_cert(folder / f"{stem}.pem", cert), key, name)


def make_leaf(
    folder: Path,
    stem: str,
    ca: CertificateAuthority,
    *,
    dns: Sequence[str] = (),
    ips: Sequence[str] = (),
    server: bool,
) -> tuple[Path, Path]:
    """A certificate named `stem` for the host names `dns` and addresses `ips`, signed by `ca`,
    for a TLS server (`server=True`) or client; returns (certificate, key) paths, written to
    `folder/STEM.pem` and `folder/STEM.key`."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(_name(stem), ca.name, key)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    names += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    key_path = folder / f"{stem}.key"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return _write_cert(folder / f"{stem}.pem", builder.sign(ca.key, hashes.SHA256())), key_path
