"""Verifies a latchkey access token with PyJWT, from the JWKS alone.

usage: verify_jwt.py JWKS_URL ISSUER AUDIENCE TOKEN
Prints the verified claims as JSON; exits 1 with the reason if verification fails.
"""
import json
import sys

import jwt


def main() -> int:
    jwks_url, issuer, audience, token = sys.argv[1:5]
    client = jwt.PyJWKClient(jwks_url)
    try:
        key = client.get_signing_key_from_jwt(token)
        header = jwt.get_unverified_header(token)
        if header.get("typ", "").lower() != "at+jwt":
            raise jwt.InvalidTokenError(f"typ is {header.get('typ')!r}, expected at+jwt")
        claims = jwt.decode(
            token,
            key.key,
            algorithms=["EdDSA", "ES256", "RS256"],
            audience=audience,
            issuer=issuer,
            options={"require": ["exp", "iat", "iss", "aud", "sub", "jti"]},
        )
    except Exception as e:  # noqa: BLE001 - report any failure
        print(f"{type(e).__name__}: {e}")
        return 1
    print(json.dumps(claims))
    return 0


if __name__ == "__main__":
    sys.exit(main())
