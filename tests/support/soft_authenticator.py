"""A software WebAuthn authenticator for the API tests: soft-webauthn (PyPI)
holds the key pair and makes attestations and assertions (with fido2's COSE
and CBOR), spoken to over stdin/stdout, one JSON line each way:

  {"op": "create", "options": <the API's creation options>, "origin": "..."}
      -> {"credential": <RegisterPublicKeyCredential JSON>}
  {"op": "get", "options": <the API's request options>, "origin": "..."}
      -> {"credential": <PublicKeyCredential JSON>}
  anything that fails -> {"error": "..."}

Binary fields travel in base64url, as the API writes them. The device holds
one credential, and verifies its user (the UV flag) as a phone or a security
key with a PIN would: soft-webauthn sets user presence only, so its
attestation gets the UV bit (a `none` attestation signs nothing) and its
assertions are signed here with UV set, by the same key.
"""
import json
import sys
from base64 import urlsafe_b64decode, urlsafe_b64encode
from struct import pack

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from fido2 import cbor
from fido2.utils import sha256
from soft_webauthn import SoftWebauthnDevice

UP, UV = 0x01, 0x04


def b64d(s):
    return urlsafe_b64decode(s + "=" * (-len(s) % 4))


def b64e(b):
    return urlsafe_b64encode(b).decode().rstrip("=")


class VerifyingDevice(SoftWebauthnDevice):
    def create(self, options, origin):
        cred = super().create(options, origin)
        att = cbor.decode(cred["response"]["attestationObject"])
        auth = bytearray(att["authData"])
        auth[32] |= UV
        att["authData"] = bytes(auth)
        cred["response"]["attestationObject"] = cbor.encode(att)
        return cred

    def get(self, options, origin):
        if self.rp_id != options["publicKey"]["rpId"]:
            raise ValueError("this device has no credential for " + options["publicKey"]["rpId"])
        self.sign_count += 1
        client_data = json.dumps({
            "type": "webauthn.get",
            "challenge": b64e(options["publicKey"]["challenge"]),
            "origin": origin,
        }).encode()
        auth = sha256(self.rp_id.encode()) + bytes([UP | UV]) + pack(">I", self.sign_count)
        signature = self.private_key.sign(auth + sha256(client_data), ec.ECDSA(hashes.SHA256()))
        return {
            "id": b64e(self.credential_id),
            "rawId": self.credential_id,
            "response": {
                "authenticatorData": auth,
                "clientDataJSON": client_data,
                "signature": signature,
                "userHandle": self.user_handle,
            },
            "type": "public-key",
        }


def creation(options):
    pk = dict(options["publicKey"])
    pk["challenge"] = b64d(pk["challenge"])
    pk["user"] = dict(pk["user"], id=b64d(pk["user"]["id"]))
    return {"publicKey": pk}


def request(options):
    pk = dict(options["publicKey"])
    pk["challenge"] = b64d(pk["challenge"])
    return {"publicKey": pk}


def as_json(cred):
    response = {k: (b64e(v) if isinstance(v, bytes) else v) for k, v in cred["response"].items()}
    return {
        "id": b64e(cred["rawId"]),
        "rawId": b64e(cred["rawId"]),
        "type": "public-key",
        "response": response,
        "extensions": {},
    }


def main():
    device = VerifyingDevice()
    for line in sys.stdin:
        try:
            msg = json.loads(line)
            if msg["op"] == "create":
                out = {"credential": as_json(device.create(creation(msg["options"]), msg["origin"]))}
            elif msg["op"] == "get":
                out = {"credential": as_json(device.get(request(msg["options"]), msg["origin"]))}
            else:
                out = {"error": "unknown op " + msg["op"]}
        except Exception as e:  # the test reads the error
            out = {"error": repr(e)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
