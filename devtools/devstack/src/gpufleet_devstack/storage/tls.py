"""A private CA and one certificate for 127.0.0.1 and localhost: the https storage servers'
(web.py, azurite.py). A client trusts them by the CA's file, never by turning checks off."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from gpufleet_auth import write_secret

__all__ = ["LocalTls", "local_tls"]

VALID = dt.timedelta(days=825)
RENEW_BEFORE = dt.timedelta(days=30)


@dataclass(frozen=True)
class LocalTls:
    """The files: `ca` for the clients, `cert` and `key` for the servers."""

    ca: Path
    cert: Path
    key: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _fresh(files: LocalTls) -> bool:
    if not (files.ca.is_file() and files.cert.is_file() and files.key.is_file()):
        return False
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    return cert.not_valid_after_utc - dt.datetime.now(dt.UTC) > RENEW_BEFORE


def local_tls(directory: Path) -> LocalTls:
    """The CA and the server certificate in `directory`: kept while valid (a client told
    the CA once keeps trusting it), made anew otherwise."""
    files = LocalTls(directory / "ca.pem", directory / "cert.pem", directory / "key.pem")
    if _fresh(files):
        return files
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_id = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gpufleet local storage CA"))
        .issuer_name(_name("gpufleet local storage CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ca_id, critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALID)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_id), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    write_secret(
        files.key,
        key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    )
    files.cert.write_bytes(cert.public_bytes(pem))
    files.ca.write_bytes(ca.public_bytes(pem))
    return files
