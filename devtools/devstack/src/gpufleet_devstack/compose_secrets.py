"""The secrets of the compose stack, generated once on the operator's machine (dev tool).

    uv run python -m gpufleet_devstack.compose_secrets deploy/secrets   # `just compose-secrets`

Writes (0600, the folder is git-ignored):
- `auth/`: the authority (operator, account and system keys; gpufleet_auth.Authority);
  the provisioner alone gets it (signing keys: join tokens, users, revocations);
- `nats-auth.conf`: the servers' decentralized-auth block (operator JWT, resolver, preload);
- `ca.pem`, `nats-cert.pem`, `nats-key.pem`: a private CA and the NATS servers' certificate
  (names nats-1..3 and localhost), for client and route TLS;
- `<service>.creds` for each service, `gateway.creds` (the web console's gateway: it may only
  redeem sign-in codes and end console sessions), `operator.creds` (the bootstrap container
  and you), `local-dev.creds` (user `dev` of account `local`).
Run again: existing files are kept (the same keys), missing ones are made.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import sys
from collections.abc import Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from gpufleet_auth import Authority, Creds, write_secret

SERVICES = ("scheduler", "provisioner", "billing", "device-fleet", "datastore")
NATS_NAMES = ("nats-1", "nats-2", "nats-3", "localhost")
VALID = dt.timedelta(days=825)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def certificates(out: Path) -> None:
    """A CA and one certificate for the three NATS servers (server and route TLS)."""
    if (out / "nats-cert.pem").exists():
        return
    now = dt.datetime.now(dt.UTC)
    ca_key = _key()
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gpufleet compose CA"))
        .issuer_name(_name("gpufleet compose CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALID)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = _key()
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in NATS_NAMES]
    sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("nats"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALID)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (out / "ca.pem").write_text(ca.public_bytes(serialization.Encoding.PEM).decode())
    write_secret(out / "nats-key.pem", _pem_key(key))
    (out / "nats-cert.pem").write_text(cert.public_bytes(serialization.Encoding.PEM).decode())


def generate(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    authority = Authority.load_or_create(out / "auth")
    certificates(out)
    # The servers keep their resolver store on their data volume.
    write_secret(out / "nats-auth.conf", authority.server_config(Path("/data/jwt")))
    # The operator JWT is referenced by path: inline it for the containers.
    conf = (out / "nats-auth.conf").read_text()
    operator_file = authority.directory / "operator.jwt"
    conf = conf.replace(f'"{operator_file}"', authority.operator_jwt())
    write_secret(out / "nats-auth.conf", conf)
    made: list[Path] = []
    issuer = authority.issuer
    for service in SERVICES:
        path = out / f"{service}.creds"
        if not path.exists():
            made.append(issuer.service(service).write(path))
    others: dict[str, Callable[[], Creds]] = {
        "gateway": lambda: issuer.gateway("console"),  # the console gateway, as `just up` has it
        "operator": issuer.operator,
        "local-dev": lambda: issuer.user("local", "dev"),
    }
    for name, issue in others.items():
        path = out / f"{name}.creds"
        if not path.exists():
            made.append(issue().write(path))
    return made


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("out", type=Path, nargs="?", default=Path("deploy/secrets"))
    args = parser.parse_args(argv)
    made = generate(args.out)
    print(f"compose secrets in {args.out} ({len(made)} credentials made)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
