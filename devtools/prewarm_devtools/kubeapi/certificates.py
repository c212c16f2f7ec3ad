"""A cluster CA and the API server's serving certificate, made at start, for TLS on 127.0.0.1.

Why TLS at all on a loopback address: client-go (kubectl) reads a kubeconfig user's credentials only
when the transport is TLS (clientcmd's "only try to read the auth information if we are secure"), so
over plain HTTP kubectl sends no bearer token and a server that enforces authentication answers 401.

`ServingCertificate.generate()` makes a CA (as a cluster's `ca.crt`) and a certificate it signs for
`127.0.0.1` and `localhost`, with the extensions Go's and OpenSSL's strict verification want (CA basic
constraints and key usage, subject and authority key identifiers, server auth). The keys are P-256:
generating them takes milliseconds, so every server start gets its own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServingCertificate"]

# A server lives as long as its process; a year is long enough and short enough.
LIFETIME = datetime.timedelta(days=365)
# Clocks a little behind this one still accept the certificates at once.
BACKDATE = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class ServingCertificate:
    """PEM texts: the CA clients trust, and the server's certificate and private key."""

    ca_pem: str
    certificate_pem: str
    key_pem: str = field(repr=False)

    @classmethod
    def generate(cls, hosts: Sequence[str] = ("127.0.0.1", "localhost"), *,
                 common_name: str = "prewarm-local-kubernetes") -> ServingCertificate:
        """A new CA and a serving certificate it signs for `hosts` (IP addresses or DNS names)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        if not hosts:
            raise ValueError("hosts must name at least one IP address or DNS name")
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name}-ca")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        certificate = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE).not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cls(
            ca_pem=ca.public_bytes(serialization.Encoding.PEM).decode(),
            certificate_pem=certificate.public_bytes(serialization.Encoding.PEM).decode(),
            key_pem=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()).decode(),
        )

    def server_context(self) -> ssl.SSLContext:
        """A server-side context serving this certificate over TLS 1.2+ and HTTP/1.1 (ALPN)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # Go clients offer h2 first; HTTP/1.1 is all this server speaks.
        context.set_alpn_protocols(["http/1.1"])
        # load_cert_chain reads files only: they live just long enough to be loaded.
        with tempfile.TemporaryDirectory(prefix="kubeapi-tls-") as directory:
            chain, key = Path(directory) / "tls.crt", Path(directory) / "tls.key"
            chain.write_text(self.certificate_pem)
            key.touch(mode=0o600)
            key.write_text(self.key_pem)
            context.load_cert_chain(chain, key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A client-side context that trusts this CA only (host names checked)."""
        return ssl.create_default_context(cadata=self.ca_pem)
