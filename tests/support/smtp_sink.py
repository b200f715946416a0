"""A real SMTP server for tests (aiosmtpd): stores every message it accepts
as DIR/<n>.eml and prints "READY <port>" once it listens. Recipients whose
address starts with "bounce" are refused with 550 (a permanent failure), and
those starting with "greylist" with 450 (a temporary one, as greylisting does).
A message to an address starting with "slow" is stored at once and answered
8 s later: a sender that dies meanwhile has had its message delivered without
hearing so.

usage: smtp_sink.py DIR PORT [plain|starttls|implicit]   (PORT 0 picks a free port)

With starttls or implicit, the server makes a certificate for 127.0.0.1 and
localhost, signed by a throwaway CA written to DIR/ca.pem (for the client to
trust), and requires TLS: STARTTLS before any mail, or TLS from the first byte.
"""
import asyncio
import datetime
import ipaddress
import os
import socket
import ssl
import sys
import time

from aiosmtpd.controller import Controller


class Store:
    def __init__(self, directory):
        self.directory = directory
        self.count = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):
        if address.lower().startswith("bounce"):
            return "550 5.1.1 no such mailbox"
        if address.lower().startswith("greylist"):
            return "450 4.7.1 greylisted, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        path = os.path.join(self.directory, f"{time.time_ns()}-{self.count}.eml")
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(envelope.original_content or envelope.content)
        os.rename(tmp, path)
        if any(r.lower().startswith("slow") for r in envelope.rcpt_tos):
            await asyncio.sleep(8)
        return "250 OK"


def tls_context(directory):
    """A server context whose certificate a client trusts through DIR/ca.pem."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "latchkey test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = lambda c: c.public_bytes(serialization.Encoding.PEM)
    with open(os.path.join(directory, "ca.pem"), "wb") as f:
        f.write(pem(ca))
    cert_path = os.path.join(directory, "server.pem")
    key_path = os.path.join(directory, "server.key")
    with open(cert_path, "wb") as f:
        f.write(pem(cert))
    with open(key_path, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


def main():
    directory, port = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "plain"
    os.makedirs(directory, exist_ok=True)
    if port == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
    kwargs = {}
    if mode == "starttls":
        kwargs = {"tls_context": tls_context(directory), "require_starttls": True}
    elif mode == "implicit":
        kwargs = {"ssl_context": tls_context(directory)}
    elif mode != "plain":
        sys.exit(f"unknown mode {mode}")
    controller = Controller(Store(directory), hostname="127.0.0.1", port=port, **kwargs)
    controller.start()
    print(f"READY {port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        controller.stop()


if __name__ == "__main__":
    main()
