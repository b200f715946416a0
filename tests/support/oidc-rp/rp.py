"""A relying party built on Authlib (Python), the second library that signs
in with latchkey in the conformance scenarios (tests/it/conformance.rs),
beside openid-client (rp.mjs). Same commands, same JSON in and out:

  python3 rp.py start  '{"issuer","base","client_id","client_secret"?,"redirect_uri","scope",
                         "extra"?,"no_nonce"?,"auth"?}'
    -> {"url", "code_verifier", "state", "nonce"}
  python3 rp.py finish '{...start's input, "callback", "code_verifier", "state", "nonce",
                         "max_age"?, "post_logout_redirect_uri"?}'
    -> {"claims", "userinfo", "refreshed", "end_session", "access_token", "id_token", "scope"}

What it checks is Authlib's: the id_token's signature against the
provider's JWKS, and CodeIDToken's claim rules (iss, aud, azp, exp, iat,
nonce, at_hash, auth_time against max_age); plus, here, the `iss`
authorization response parameter (RFC 9207) and `state`, which Authlib
leaves to the application. `base` is where latchkey really listens: every
request to the issuer's origin goes there.

Any refusal prints {"error", "code"} and exits 1.
"""

import json
import secrets
import sys
import time
from urllib.parse import parse_qs, urlencode, urlparse

import requests
from authlib.common.security import generate_token
from authlib.integrations.requests_client import OAuth2Session
from authlib.jose import JsonWebKey, JsonWebToken
from authlib.oidc.core import CodeIDToken

command, raw = sys.argv[1], sys.argv[2]
p = json.loads(raw)
issuer_origin = "{0.scheme}://{0.netloc}".format(urlparse(p["issuer"]))


def to_base(url):
    """The address of a URL of the issuer's origin where latchkey listens."""
    return p["base"] + url[len(issuer_origin):] if url.startswith(issuer_origin) else url


def discovery():
    r = requests.get(to_base(p["issuer"].rstrip("/") + "/.well-known/openid-configuration"), timeout=10)
    r.raise_for_status()
    meta = r.json()
    if meta["issuer"] != p["issuer"]:
        raise ValueError("discovery's issuer is not the one asked")
    return meta


def session(meta, **kwargs):
    method = "client_secret_post" if p.get("auth") == "post" else "client_secret_basic"
    return OAuth2Session(
        p["client_id"],
        p.get("client_secret"),
        token_endpoint_auth_method=method if p.get("client_secret") else "none",
        redirect_uri=p["redirect_uri"],
        scope=p.get("scope", "openid email profile"),
        code_challenge_method="S256",
        **kwargs,
    )


def fail(message, code=None):
    print(json.dumps({"error": message, "code": code}))
    sys.exit(1)


def validated_id_token(meta, id_token, access_token):
    jwks = requests.get(to_base(meta["jwks_uri"]), timeout=10).json()
    keys = JsonWebKey.import_key_set(jwks)
    alg = p.get("id_token_alg", "EdDSA")
    claims = JsonWebToken([alg]).decode(
        id_token,
        keys,
        claims_cls=CodeIDToken,
        claims_options={"iss": {"essential": True, "value": meta["issuer"]}},
        claims_params={
            "nonce": p.get("nonce"),
            "client_id": p["client_id"],
            "access_token": access_token,
            **({"max_age": p["max_age"]} if "max_age" in p else {}),
        },
    )
    claims.validate(now=int(time.time()), leeway=5)
    if p.get("nonce") is None and "nonce" in claims:
        raise ValueError("a nonce in the id_token, none in the request")
    return dict(claims)


def main():
    meta = discovery()
    if command == "start":
        verifier = generate_token(64)
        state = secrets.token_urlsafe(16)
        nonce = None if p.get("no_nonce") else secrets.token_urlsafe(16)
        extra = dict(p.get("extra") or {})
        if nonce:
            extra["nonce"] = nonce
        url, _ = session(meta).create_authorization_url(
            meta["authorization_endpoint"], state=state, code_verifier=verifier, **extra
        )
        print(json.dumps({"url": url, "code_verifier": verifier, "state": state, "nonce": nonce}))
    elif command == "finish":
        q = {k: v[0] for k, v in parse_qs(urlparse(p["callback"]).query).items()}
        if "error" in q:
            fail(q.get("error_description", q["error"]), q["error"])
        if q.get("state") != p["state"]:
            fail("state mismatch")
        if q.get("iss") != meta["issuer"]:
            fail("the iss response parameter is missing or another issuer's (RFC 9207)")
        s = session(meta)
        token = s.fetch_token(
            to_base(meta["token_endpoint"]),
            grant_type="authorization_code",
            code=q["code"],
            code_verifier=p["code_verifier"],
        )
        claims = validated_id_token(meta, token["id_token"], token["access_token"])
        r = requests.get(
            to_base(meta["userinfo_endpoint"]),
            headers={"Authorization": "Bearer " + token["access_token"]},
            timeout=10,
        )
        r.raise_for_status()
        userinfo = r.json()
        if userinfo.get("sub") != claims["sub"]:
            fail("userinfo's sub is not the id_token's (Core 5.3.2)")
        refreshed = None
        if token.get("refresh_token"):
            t = s.refresh_token(to_base(meta["token_endpoint"]), refresh_token=token["refresh_token"])
            refreshed = {"access_token": t["access_token"], "refresh_token": t.get("refresh_token")}
        end = {"id_token_hint": token["id_token"]}
        if p.get("post_logout_redirect_uri"):
            end.update(post_logout_redirect_uri=p["post_logout_redirect_uri"], state="bye")
        print(json.dumps({
            "claims": claims,
            "userinfo": userinfo,
            "refreshed": refreshed,
            "end_session": meta["end_session_endpoint"] + "?" + urlencode(end),
            "access_token": token["access_token"],
            "id_token": token["id_token"],
            "scope": token.get("scope"),
        }))
    else:
        fail("unknown command " + command)


try:
    main()
except SystemExit:
    raise
except Exception as e:  # every refusal of the library, one line
    fail("{}: {}".format(type(e).__name__, e), getattr(e, "error", None))
