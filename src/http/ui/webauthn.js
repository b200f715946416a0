// WebAuthn's options and answers carry binary fields; latchkey writes
// them in base64url. Shared by the account page (/ui/account) and the
// sign-in pages (/oauth/*) as `latchkeyWebauthn`.
"use strict";

const latchkeyWebauthn = (() => {
  function b64urlToBuf(s) {
    const b64 = s.replace(/-/g, "+").replace(/_/g, "/") + "===".slice((s.length + 3) % 4);
    return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)).buffer;
  }

  function bufToB64url(buf) {
    let s = "";
    for (const b of new Uint8Array(buf)) s += String.fromCharCode(b);
    return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
  }

  // The options as the browser wants them: the challenge, the user's id (a
  // creation) and the credential ids of the list (`excludeCredentials` for a
  // creation, `allowCredentials` for a request) as bytes.
  function withBuffers(options, list) {
    const pk = structuredClone(options.publicKey);
    pk.challenge = b64urlToBuf(pk.challenge);
    if (pk.user) pk.user.id = b64urlToBuf(pk.user.id);
    for (const c of pk[list] || []) c.id = b64urlToBuf(c.id);
    return { publicKey: pk };
  }

  const creationOptions = (options) => withBuffers(options, "excludeCredentials");
  const requestOptions = (options) => withBuffers(options, "allowCredentials");

  // A PublicKeyCredential as the API takes it: binary fields in base64url,
  // with the `response` fields of a creation or of a request.
  function credentialJson(cred, response) {
    return {
      id: cred.id,
      rawId: bufToB64url(cred.rawId),
      type: cred.type,
      extensions: cred.getClientExtensionResults ? cred.getClientExtensionResults() : {},
      response,
    };
  }

  const registrationJson = (cred) => credentialJson(cred, {
    clientDataJSON: bufToB64url(cred.response.clientDataJSON),
    attestationObject: bufToB64url(cred.response.attestationObject),
    transports: cred.response.getTransports ? cred.response.getTransports() : [],
  });

  const assertionJson = (cred) => credentialJson(cred, {
    clientDataJSON: bufToB64url(cred.response.clientDataJSON),
    authenticatorData: bufToB64url(cred.response.authenticatorData),
    signature: bufToB64url(cred.response.signature),
    userHandle: cred.response.userHandle ? bufToB64url(cred.response.userHandle) : null,
  });

  return { b64urlToBuf, bufToB64url, creationOptions, requestOptions, registrationJson, assertionJson };
})();
