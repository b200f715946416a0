//! The OpenAPI schemas of the request fields, built from the same patterns
//! and bounds that `domain::input` enforces, so that the document says
//! exactly which values are accepted (the API fuzzing in `scripts/fuzz-api`
//! holds the two to each other).

use utoipa::openapi::schema::{Object, ObjectBuilder, SchemaType, Type};

use crate::domain::input::{CODE_PATTERN, EMAIL_PATTERN, NAME_PATTERN, OPAQUE_PATTERN};

fn string(min: Option<usize>, max: Option<usize>, pattern: Option<&str>, description: &str) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(min)
        .max_length(max)
        .pattern(pattern)
        .description(Some(description))
        .build()
}

pub fn email() -> Object {
    string(
        Some(3),
        Some(254),
        Some(EMAIL_PATTERN),
        "A plain ASCII address (dot-atom @ host name), trimmed and lower-cased before use",
    )
}

pub fn password() -> Object {
    string(
        Some(8),
        Some(128),
        None,
        "8 to 128 characters (Unicode scalar values)",
    )
}

/// A password checked against the stored one: anything else is a wrong one.
pub fn current_password() -> Object {
    string(Some(1), Some(1024), None, "The current password")
}

pub fn code() -> Object {
    string(None, None, Some(CODE_PATTERN), "The 6-digit code from the email")
}

pub fn name() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .max_length(Some(200))
        .pattern(Some(NAME_PATTERN))
        .description(Some(
            "A display name, at most 200 characters, no control characters",
        ))
        .build()
}

pub fn refresh_token() -> Object {
    string(None, None, Some(OPAQUE_PATTERN), "A refresh token as issued")
}

/// Logout takes any non-empty string: a token that cannot be ours has
/// nothing to revoke, and answers the same.
pub fn any_token() -> Object {
    string(Some(1), None, None, "A refresh token")
}

/// A token this service issued (an `mfa_token`, a `ceremony_token`).
pub fn opaque_token() -> Object {
    string(None, None, Some(OPAQUE_PATTERN), "A token as issued")
}

pub fn totp_code() -> Object {
    string(
        None,
        None,
        Some(CODE_PATTERN),
        "The 6-digit code the authenticator app shows",
    )
}

pub fn recovery_code() -> Object {
    string(
        Some(1),
        Some(64),
        None,
        "One of the recovery codes (case, spaces and dashes do not matter)",
    )
}

pub fn factor_name() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .max_length(Some(64))
        .pattern(Some(NAME_PATTERN))
        .description(Some(
            "A name for the factor, at most 64 characters, no control characters",
        ))
        .build()
}

/// Base64url without padding, as WebAuthn's JSON forms write bytes, in its
/// canonical form: a length of 4n+1 characters encodes nothing, and the
/// bits a short last group leaves over are zero.
const B64URL: &str = "^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-][AQgw]|[A-Za-z0-9_-]{2}[AEIMQUYcgkosw048])?$";

fn b64url_field(description: &str) -> Object {
    string(Some(2), None, Some(B64URL), description)
}

/// A `PublicKeyCredential` in its JSON form (WebAuthn Level 3
/// `toJSON()`): `response` holds the fields named.
fn credential(response_fields: &[(&str, &str)], description: &str) -> Object {
    let mut response = ObjectBuilder::new().schema_type(Type::Object);
    for (name, what) in response_fields {
        response = response.property(*name, b64url_field(what)).required(*name);
    }
    if response_fields.iter().any(|(n, _)| *n == "signature") {
        // The account's id, for a passkey that names it (a discoverable one).
        response = response.property(
            "userHandle",
            ObjectBuilder::new()
                .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
                .pattern(Some(B64URL))
                .min_length(Some(2))
                .build(),
        );
    }
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some(description))
        .property("id", b64url_field("The credential id"))
        .required("id")
        .property("rawId", b64url_field("The credential id"))
        .required("rawId")
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["public-key"]))
                .build(),
        )
        .required("type")
        .property("response", response.build())
        .required("response")
        .property(
            "extensions",
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(
                    "The client's extension outputs (getClientExtensionResults()); none are needed",
                ))
                .max_properties(Some(0))
                .build(),
        )
        .build()
}

/// What `navigator.credentials.create()` gives, for registering a passkey.
pub fn registration() -> Object {
    credential(
        &[
            ("clientDataJSON", "The client data, base64url"),
            ("attestationObject", "The attestation object, base64url"),
        ],
        "The PublicKeyCredential of navigator.credentials.create(), binary fields in base64url",
    )
}

/// What `navigator.credentials.get()` gives, for signing in with a passkey.
pub fn assertion() -> Object {
    credential(
        &[
            ("clientDataJSON", "The client data, base64url"),
            ("authenticatorData", "The authenticator data, base64url"),
            ("signature", "The signature, base64url"),
        ],
        "The PublicKeyCredential of navigator.credentials.get(), binary fields in base64url",
    )
}
