"""The interception CA, created on first run in mitmproxy's confdir layout.

mitmproxy signs every leaf certificate with the CA's own key and serves the leaves with that key
too, so the CA's key type decides the cost of every intercepted handshake. mitmproxy generates
RSA-2048 (about 0.5 ms per signature on these machines); an ECDSA P-256 CA makes both the leaf
signing and the per-handshake signature roughly ten times cheaper. Writing the files ourselves,
in the names mitmproxy looks for, keeps `mitmdump --set confdir=…` working on the same directory.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mitmproxy import certs

from .statedir import CA_BASENAME, ca_paths

CA_VALIDITY = datetime.timedelta(days=3650)


def ensure_ca(confdir: Path, common_name: str = "sealgate egress CA") -> Path:
    """Create the CA if there is none; returns the path of the public certificate."""
    key_file, cert_file = ca_paths(confdir)
    confdir.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(confdir, 0o700)
    if key_file.exists():
        os.chmod(key_file, 0o600)
        if not cert_file.exists():
            pem = x509.load_pem_x509_certificates(key_file.read_bytes())[0]
            cert_file.write_bytes(pem.public_bytes(serialization.Encoding.PEM))
        return cert_file

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sealgate"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    _write_private(key_file, key_pem + cert_pem)
    cert_file.write_bytes(cert_pem)
    (confdir / f"{CA_BASENAME}-dhparam.pem").write_bytes(certs.DEFAULT_DHPARAM)
    return cert_file


def _write_private(path: Path, data: bytes) -> None:
    # A fresh 0600 temporary name each time (a crash cannot leave one that blocks the next
    # start), synced before it takes the real name (a power cut cannot leave an empty key).
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
