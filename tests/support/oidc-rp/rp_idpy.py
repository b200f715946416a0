"""A relying party built on idpyoidc (Python; the identity Python project's
OpenID Connect library, StandAloneClient), the fourth library that signs in
with latchkey in the conformance scenarios (tests/it/conformance.rs), beside
openid-client (rp.mjs), Authlib (rp.py) and go-oidc. Same commands, same
JSON in and out:

  python3 rp_idpy.py start  '{"issuer","base","client_id","client_secret"?,"redirect_uri","scope",
                              "extra"?,"no_nonce"?,"auth"?,"id_token_alg"?}'
    -> {"url", "code_verifier", "state", "nonce"}
  python3 rp_idpy.py finish '{...start's input, "callback", "code_verifier", "state", "nonce",
                              "max_age"?, "post_logout_redirect_uri"?}'
    -> {"claims", "userinfo", "refreshed", "end_session", "access_token", "id_token", "scope"}
  python3 rp_idpy.py logout-token '{"issuer","base","client_id","logout_token","alg"?}'
    -> {"claims"}: the token validated by the library's BackChannelLogoutRequest
       (Back-Channel Logout 1.0 §2.6: signature against the JWKS with the
       algorithm pinned, iss, aud, iat, the event, no nonce, sid or sub)

What it checks is idpyoidc's: discovery (the issuer it names), the
authorization response (`state` known, `iss` if present is the issuer's),
the id_token's signature against the JWKS with the algorithm pinned, iss,
aud, azp, exp, iat, the nonce bound to the request's state, userinfo's sub
against the id_token's, the refreshed tokens. Added here, as the library
leaves them to the application: that the `iss` response parameter is there
at all (RFC 9207), at_hash (the library checks it only for an id_token
from the authorization endpoint), and auth_time against max_age.

idpyoidc always sends a nonce and refuses an id_token without one, even
for a request that had none: with `no_nonce` the nonce is taken out of the
request it built, and it refuses the answer (the scenario expects that).

The session between `start` and `finish` (the library keeps it in memory,
keyed by state) is put back in `finish` from the state, nonce and code
verifier `start` printed, as an application keeping it in a cookie would.
`base` is where latchkey really listens: every request to the issuer's
origin goes there (the library's own httpc hook).

Any refusal prints {"error", "code"} and exits 1.
"""

import json
import sys
import time
from urllib.parse import parse_qsl, urlencode, urlparse, urlunparse

import requests
from cryptojwt.jws.utils import left_hash
from idpyoidc.client.defaults import DEFAULT_OIDC_SERVICES
from idpyoidc.client.oauth2.stand_alone_client import StandAloneClient
from idpyoidc.message.oidc import verified_claim_name

command, raw = sys.argv[1], sys.argv[2]
p = json.loads(raw)
issuer_origin = "{0.scheme}://{0.netloc}".format(urlparse(p["issuer"]))
alg = p.get("id_token_alg", p.get("alg", "EdDSA"))


def fail(message, code=None):
    print(json.dumps({"error": message, "code": code}))
    sys.exit(1)


def httpc(method, url, **kwargs):
    """The library's HTTP client: the issuer's origin is `base`; no redirects."""
    if url.startswith(issuer_origin):
        url = p["base"] + url[len(issuer_origin):]
    kwargs.setdefault("timeout", 10)
    return requests.request(method, url, allow_redirects=False, **kwargs)


class PublicClient:
    """Token endpoint authentication `none` (a public client): only its
    client_id in the body; idpyoidc has the secret-based methods only."""

    def construct(self, request, service=None, http_args=None, **kwargs):
        request["client_id"] = service.upstream_get("context").get_client_id()
        request.pop("client_secret", None)
        return http_args or {}


def client():
    """A StandAloneClient registered statically, after discovery."""
    secret = p.get("client_secret")
    method = "client_secret_post" if p.get("auth") == "post" else "client_secret_basic"
    c = StandAloneClient(
        config={
            "client_type": "oidc",
            "client_id": p["client_id"],
            "client_secret": secret,
            "issuer": p["issuer"],
            "redirect_uris": [p.get("redirect_uri", "http://127.0.0.1/callback")],
            "preference": {
                "response_types": ["code"],
                "token_endpoint_auth_method": method if secret else "none",
                "id_token_signed_response_alg": alg,
            },
            "client_authn_methods": {
                "client_secret_basic": None,
                "client_secret_post": None,
                "none": PublicClient,
            },
            "add_ons": {
                "pkce": {
                    "function": "idpyoidc.client.oauth2.add_on.pkce.add_support",
                    "kwargs": {"code_challenge_length": 64, "code_challenge_method": "S256"},
                }
            },
        },
        services={
            **DEFAULT_OIDC_SERVICES,
            "end_session": {"class": "idpyoidc.client.oidc.end_session.EndSession"},
        },
        httpc=httpc,
    )
    c.do_provider_info()
    c.do_client_registration()
    # What the client was registered with, as a registration response would
    # say: the library pins the id_token's algorithm to it (without one, it
    # takes any algorithm the JWKS has a key for).
    c.get_context().registration_response = {
        "client_id": p["client_id"],
        "id_token_signed_response_alg": alg,
        "token_endpoint_auth_method": method if secret else "none",
    }
    return c


def scope():
    return p.get("scope", "openid email profile").split()


def start(c):
    extra = dict(p.get("extra") or {})
    req = {"scope": scope(), "response_type": "code", **extra}
    url = c.init_authorization(req_args=req)
    parts = urlparse(url)
    query = parse_qsl(parts.query)
    params = dict(query)
    state = params["state"]
    nonce = params.get("nonce")
    if p.get("no_nonce"):
        query = [(k, v) for k, v in query if k != "nonce"]
        url = urlunparse(parts._replace(query=urlencode(query)))
        nonce = None
    verifier = c.get_context().cstate.get_claim(state, "code_verifier")
    return {"url": url, "code_verifier": verifier, "state": state, "nonce": nonce}


def restore(c):
    """The session `start` left, as the library stores it under the state."""
    context = c.get_context()
    extra = dict(p.get("extra") or {})
    request = {
        "iss": context.get("issuer"),
        "state": p["state"],
        "redirect_uri": p["redirect_uri"],
        "response_type": "code",
        "scope": scope(),
        "code_verifier": p["code_verifier"],
        "code_challenge_method": "S256",
        **extra,
    }
    if p.get("nonce"):
        request["nonce"] = p["nonce"]
        context.cstate.bind_key(p["nonce"], p["state"])
    context.cstate.set(p["state"], request)


def at_hash(access_token):
    """The library's left_hash, with Ed25519's SHA-512 for EdDSA (its own
    check would take the hash from the algorithm's last three characters)."""
    return left_hash(access_token, "HS512" if alg == "EdDSA" else "HS" + alg[-3:])


def finish(c):
    restore(c)
    query = dict(parse_qsl(urlparse(p["callback"]).query))
    if "error" in query:
        fail(query.get("error_description", query["error"]), query["error"])
    if "iss" not in query:
        fail("no iss response parameter (RFC 9207)")
    # state (a known session), iss (the issuer's), the code: the library's.
    response = c.finalize_auth(query)
    if "error" in response:
        fail(response.get("error_description", response["error"]), response["error"])
    state = response["state"]
    if state != p["state"]:
        fail("state mismatch")
    # The code exchange; the id_token verified as the token service does.
    tokens = c.get_tokens(state)
    id_token = tokens.get(verified_claim_name("id_token"))
    if id_token is None:
        fail("no id_token")
    claims = id_token.to_dict()
    if "at_hash" in claims and claims["at_hash"] != at_hash(tokens["access_token"]):
        fail("at_hash is not the access token's")
    if "max_age" in p:
        if "auth_time" not in claims or time.time() - claims["auth_time"] > p["max_age"] + 5:
            fail("auth_time missing or older than max_age")
    userinfo = c.get_user_info(state, access_token=tokens["access_token"])
    refreshed = None
    if tokens.get("refresh_token"):
        r = c.refresh_access_token(state)
        refreshed = {"access_token": r["access_token"], "refresh_token": r.get("refresh_token")}
    end = {}
    if p.get("post_logout_redirect_uri"):
        end = {"post_logout_redirect_uri": p["post_logout_redirect_uri"], "state": "bye"}
    # The id_token of the session as id_token_hint: the library's.
    url = c.get_service("end_session").get_request_parameters(state=state, request_args=end)["url"]
    print(json.dumps({
        "claims": claims,
        "userinfo": userinfo.to_dict(),
        "refreshed": refreshed,
        "end_session": url,
        "access_token": tokens["access_token"],
        "id_token": tokens["id_token"],
        "scope": " ".join(tokens["scope"]) if isinstance(tokens.get("scope"), list) else tokens.get("scope"),
    }))


def logout_token(c):
    """A logout token, as the library's back-channel logout verifies one
    (its `backchannel_logout` then looks the session up, which this
    program does not keep)."""
    from idpyoidc.message.oidc.session import BackChannelLogoutRequest

    request = BackChannelLogoutRequest(logout_token=p["logout_token"])
    keyjar = c.get_attribute("keyjar")
    # The provider's JWKS, read through this program's HTTP client (the key
    # jar's own would go to the issuer's name, not to `base`).
    context = c.get_context()
    jwks = httpc("GET", context.provider_info["jwks_uri"]).json()
    keyjar.import_jwks(jwks, context.get("issuer"))
    request.verify(
        aud=p["client_id"],
        iss=context.get("issuer"),
        keyjar=keyjar,
        allowed_sign_alg=alg,
        skew=5,
    )
    print(json.dumps({"claims": request[verified_claim_name("logout_token")].to_dict()}))


def main():
    c = client()
    if command == "start":
        print(json.dumps(start(c)))
    elif command == "finish":
        finish(c)
    elif command == "logout-token":
        logout_token(c)
    else:
        fail("unknown command " + command)


try:
    main()
except SystemExit:
    raise
except Exception as e:  # every refusal of the library, one line
    fail("{}: {}".format(type(e).__name__, e), getattr(e, "error", None))
