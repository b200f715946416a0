//! Who signed in at GitHub, from its REST API: GitHub is no OpenID
//! Provider (no id_token), so the identity is what `GET /user` and
//! `GET /user/emails` answer with the access token its token endpoint
//! gave latchkey directly (over TLS, for this client's code and PKCE
//! verifier: no one else's answer can stand in for them).
//!
//! - The subject is the account's numeric `id`, never its `login`: a
//!   login can be renamed and then taken by someone else, an id never.
//! - The address is the account's primary one (`/user/emails`, scope
//!   `user:email`), with GitHub's `verified` flag; another address of the
//!   account, verified or not, is not read. `/user`'s `email` (the public
//!   address the person chose to show, possibly none) is not read either.
//!
//! A pure function of the two answers ([`identity`]), tested below.

use serde_json::Value;

use super::id_token::Identity;

/// The identity of GitHub's answers to `GET /user` (`user`) and
/// `GET /user/emails` (`emails`); `None` when `user` has no numeric `id`.
pub fn identity(user: &Value, emails: &Value) -> Option<Identity> {
    let id = user["id"].as_u64()?;
    let primary = emails
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["primary"] == Value::Bool(true));
    let email = primary
        .and_then(|e| e["email"].as_str())
        .and_then(|e| crate::domain::input::Email::parse("email", e).ok())
        .map(|e| e.as_str().to_string());
    let email_verified = email.is_some() && primary.is_some_and(|e| e["verified"] == Value::Bool(true));
    Some(Identity {
        subject: id.to_string(),
        email,
        email_verified,
        // GitHub asserts no authentication methods.
        amr: Vec::new(),
        auth_time: None,
        // The profile's name, else the login.
        name: ["name", "login"].iter().find_map(|k| {
            user[*k]
                .as_str()
                .and_then(|n| crate::domain::input::parse_name("name", Some(n)).ok().flatten())
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user() -> Value {
        json!({"login": "octocat", "id": 583231, "name": "The Octocat", "email": "public@example.com"})
    }

    #[test]
    fn the_subject_is_the_numeric_id_and_the_address_the_verified_primary_one() {
        let emails = json!([
            {"email": "old@example.com", "primary": false, "verified": true, "visibility": null},
            {"email": "Octo@Example.com", "primary": true, "verified": true, "visibility": "public"},
        ]);
        let i = identity(&user(), &emails).unwrap();
        assert_eq!(i.subject, "583231");
        assert_eq!(i.email.as_deref(), Some("octo@example.com"));
        assert!(i.email_verified);
        assert!(i.amr.is_empty());
        assert_eq!(i.name.as_deref(), Some("The Octocat"));
        let nameless = json!({"login": "octocat", "id": 1, "name": null});
        assert_eq!(
            identity(&nameless, &emails).unwrap().name.as_deref(),
            Some("octocat")
        );
    }

    #[test]
    fn an_unverified_primary_address_is_unverified_even_when_another_address_is_verified() {
        let emails = json!([
            {"email": "other@example.com", "primary": false, "verified": true},
            {"email": "octo@example.com", "primary": true, "verified": false},
        ]);
        let i = identity(&user(), &emails).unwrap();
        assert_eq!(i.email.as_deref(), Some("octo@example.com"));
        assert!(!i.email_verified);
    }

    #[test]
    fn without_a_primary_address_the_public_one_of_the_profile_is_not_taken() {
        for emails in [
            json!([]),
            json!({"message": "Not Found"}),
            json!([{"email": "x@example.com", "verified": true}]),
        ] {
            let i = identity(&user(), &emails).unwrap();
            assert_eq!(i.email, None, "{emails}");
            assert!(!i.email_verified);
        }
    }

    #[test]
    fn a_primary_entry_that_is_no_address_counts_as_none() {
        let emails = json!([{"email": "not an address", "primary": true, "verified": true}]);
        let i = identity(&user(), &emails).unwrap();
        assert_eq!((i.email, i.email_verified), (None, false));
    }

    #[test]
    fn an_answer_without_a_numeric_id_is_no_identity() {
        let emails = json!([]);
        assert!(identity(&json!({"login": "octocat"}), &emails).is_none());
        assert!(identity(&json!({"login": "octocat", "id": "583231"}), &emails).is_none());
        assert!(identity(&json!({"id": -1}), &emails).is_none());
        assert!(identity(&Value::Null, &emails).is_none());
    }
}
