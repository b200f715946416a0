//! Signing in with another provider: what an upstream identity may do to
//! local accounts, as a pure decision over what the store read (the
//! account the identity is linked to, the account its address names) and
//! what the provider asserted. The sign-in flow gathers these (the
//! upstream's code, its validated id_token or GitHub's API answers: the
//! service in `mod.rs`) and applies this rule, kept apart and tested
//! row by row because it is where identity services get takeovers wrong
//! (docs/security.md, 3.18).
//!
//! An upstream identity is keyed by (issuer, subject), never by email: an
//! address is only ever a reason to *ask* for proof, never a key.
//!
//! ```text
//!   intent     linked to            address (verified, trusted)     decision
//!   ─────────  ───────────────────  ──────────────────────────────  ─────────────────────────
//!   sign in    account A            (not read)                      SignIn(A) | Refuse(Disabled)
//!   sign in    nothing              not verified, or not trusted    Refuse(UnverifiedEmail)
//!   sign in    nothing              names account A, verified       ProveFirst(A) | Refuse(Disabled)
//!   sign in    nothing              names account A, never verified ProveMailbox(A) | Refuse(Disabled)
//!   sign in    nothing              names no account                Create | Refuse(NoAccount)
//!   link to B  (B disabled)         (not read)                      Refuse(Disabled)
//!   link to B  account B            (not read)                      AlreadyLinked
//!   link to B  another account      (not read)                      Refuse(LinkedElsewhere)
//!   link to B  nothing              (not read)                      Link(B)
//! ```
//!
//! `ProveFirst`: the person proves the local account once (its password
//! and second factor, or a code mailed to it), and only then is the link
//! made; until then the upstream sign-in signs in to nothing.
//!
//! `ProveMailbox`: the account at that address was never verified (a
//! sign-up that never entered its code, or an address an administrator
//! set), so whoever chose its password never proved the mailbox: a
//! pre-registration by an attacker waiting for the owner. The person
//! proves the mailbox with a mailed code, and the account's password,
//! second factors and sessions are removed before the link is made, so
//! nothing the pre-registration set survives (the owner sets a password
//! later if they want one).
//!
//! `link to B` is a person signed in to B (a fresh authentication) adding
//! a provider on their account page: the identity is theirs to link
//! whatever address it asserts, and is refused only if another account
//! holds it.

/// What the operator allows a provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Its `email_verified` claim is believed (a provider that lets a
    /// tenant's administrator set any address, unverified, must not be:
    /// the "nOAuth" takeovers of 2023).
    pub trusts_email_verified: bool,
    /// A new identity with a verified address no account has creates one
    /// (just-in-time); otherwise it signs in to linked accounts only.
    pub may_create: bool,
}

/// What the provider asserted, beside (issuer, subject).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asserted {
    pub has_email: bool,
    /// `email_verified: true` (absent counts as false).
    pub email_verified: bool,
}

/// A local account, as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    pub id: String,
    pub disabled: bool,
    /// Its address was proved (a code entered); false for a sign-up that
    /// never entered its code and for an address an administrator set.
    pub email_verified: bool,
}

/// Why the arrival is signed into nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The account is disabled.
    Disabled,
    /// No address, an unverified one, or a provider whose verification is
    /// not trusted: it neither links nor creates.
    UnverifiedEmail,
    /// No account has the address, and the provider may not create one.
    NoAccount,
    /// Linking: the identity is another account's.
    LinkedElsewhere,
}

/// What to do with an upstream identity that arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Sign in to this linked account.
    SignIn(String),
    /// A verified account has the address: the person proves the account
    /// (password and second factor, or a mailed code), then it is linked.
    ProveFirst(String),
    /// A never-verified account has the address: the person proves the
    /// mailbox with a mailed code; the account's password, second factors
    /// and sessions are removed, then it is linked.
    ProveMailbox(String),
    /// A new account with the asserted (verified) address, linked.
    Create,
    /// Link the identity to this account (the signed-in person's).
    Link(String),
    /// It is linked to this account already: nothing to do.
    AlreadyLinked,
    Refuse(Refusal),
}

/// Signing in, or linking to the signed-in person's account.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intent {
    SignIn,
    LinkTo(Account),
}

/// The decision. `linked`: the account (issuer, subject) is linked to;
/// `by_email`: the account the asserted address names (read only when the
/// address is verified and trusted; ignored otherwise).
pub fn decide(
    intent: &Intent,
    policy: Policy,
    asserted: Asserted,
    linked: Option<&Account>,
    by_email: Option<&Account>,
) -> Decision {
    let usable = |a: &Account, then: fn(String) -> Decision| {
        if a.disabled {
            Decision::Refuse(Refusal::Disabled)
        } else {
            then(a.id.clone())
        }
    };
    match intent {
        Intent::LinkTo(me) if me.disabled => Decision::Refuse(Refusal::Disabled),
        Intent::LinkTo(me) => match linked {
            Some(a) if a.id == me.id => Decision::AlreadyLinked,
            Some(_) => Decision::Refuse(Refusal::LinkedElsewhere),
            None => Decision::Link(me.id.clone()),
        },
        Intent::SignIn => {
            if let Some(a) = linked {
                return usable(a, Decision::SignIn);
            }
            let verified = asserted.has_email && asserted.email_verified && policy.trusts_email_verified;
            if !verified {
                return Decision::Refuse(Refusal::UnverifiedEmail);
            }
            match by_email {
                Some(a) if a.email_verified => usable(a, Decision::ProveFirst),
                Some(a) => usable(a, Decision::ProveMailbox),
                None if policy.may_create => Decision::Create,
                None => Decision::Refuse(Refusal::NoAccount),
            }
        }
    }
}

/// How recent an upstream's multi-factor sign-in must be to stand for
/// the second factor here: a journey's length.
pub const MFA_FRESH_MS: i64 = 600_000;

/// Whether an upstream's sign-in stands for the account's second factor:
/// only where the operator trusts that upstream for it (`trusts_mfa`: its
/// `amr` is otherwise a claim latchkey cannot check), only when it says
/// `mfa` (RFC 8176: more than one factor; `otp` or `hwk` alone are one),
/// and only when that sign-in happened during this journey (`auth_time`
/// at most [`MFA_FRESH_MS`] before `now`, ms): a days-old single sign-on
/// session there is no fresh second factor here.
pub fn second_factor_asserted(
    trusts_mfa: bool,
    amr: &[String],
    auth_time_secs: Option<i64>,
    now: i64,
) -> bool {
    let fresh = auth_time_secs.is_some_and(|t| (-60_000..=MFA_FRESH_MS).contains(&(now - t * 1000)));
    trusts_mfa && fresh && amr.iter().any(|m| m == "mfa")
}

/// The authentication methods of RFC 8176's registry (§2): the values an
/// upstream's `amr` may add to a session's here.
const REGISTERED_AMR: [&str; 21] = [
    "face", "fpt", "geo", "hwk", "iris", "kba", "mca", "mfa", "otp", "pin", "pop", "pwd", "rba", "retina",
    "sc", "sms", "swk", "tel", "user", "vbm", "wia",
];

/// A session's `amr` after a sign-in through an upstream, and whether it
/// passed the account's second factor: `fed`, then, for an upstream
/// trusted for its `amr` (`trusts_mfa`), the registered values it asserted
/// (`mfa` only when [`second_factor_asserted`]: fresh). An upstream not
/// trusted for them adds nothing: its claims would read as methods
/// latchkey saw.
pub fn session_amr(
    trusts_mfa: bool,
    amr: &[String],
    auth_time_secs: Option<i64>,
    now: i64,
) -> (String, bool) {
    let mfa = second_factor_asserted(trusts_mfa, amr, auth_time_secs, now);
    let mut out = vec!["fed"];
    if trusts_mfa {
        for m in amr {
            let keep = REGISTERED_AMR.contains(&m.as_str()) && (m != "mfa" || mfa);
            if keep && !out.contains(&m.as_str()) {
                out.push(m.as_str());
            }
        }
    }
    (out.join(" "), mfa)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: &str, disabled: bool) -> Account {
        Account {
            id: id.into(),
            disabled,
            email_verified: true,
        }
    }

    fn never_verified(id: &str) -> Account {
        Account {
            email_verified: false,
            ..account(id, false)
        }
    }

    /// One combination of the inputs: intent, policy, claims, the linked
    /// account and the account of the address.
    type Case = (Intent, Policy, Asserted, Option<Account>, Option<Account>);

    /// Every combination of the inputs.
    fn every_case() -> Vec<Case> {
        let accounts = [
            None,
            Some(account("a", false)),
            Some(account("a", true)),
            Some(account("b", false)),
            Some(never_verified("a")),
            Some(never_verified("b")),
        ];
        let mut out = Vec::new();
        for intent in [
            Intent::SignIn,
            Intent::LinkTo(account("a", false)),
            Intent::LinkTo(account("a", true)),
        ] {
            for bits in 0..16u8 {
                let [trusts, create, has, verified] = [0, 1, 2, 3].map(|i| bits & (1 << i) != 0);
                for linked in &accounts {
                    for by_email in &accounts {
                        out.push((
                            intent.clone(),
                            Policy {
                                trusts_email_verified: trusts,
                                may_create: create,
                            },
                            Asserted {
                                has_email: has,
                                email_verified: verified,
                            },
                            linked.clone(),
                            by_email.clone(),
                        ));
                    }
                }
            }
        }
        out
    }

    #[test]
    fn an_address_never_signs_anyone_in_to_an_account_it_is_not_linked_to() {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            let d = decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref());
            if let Decision::SignIn(id) = &d {
                assert_eq!(
                    Some(id),
                    linked.as_ref().map(|a| &a.id),
                    "{intent:?} {linked:?} {by_email:?}"
                );
            }
        }
    }

    #[test]
    fn only_the_signed_in_persons_own_account_is_ever_linked_without_proof() {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            if let Decision::Link(id) = decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref())
            {
                assert_eq!(intent, Intent::LinkTo(account(&id, false)));
                assert!(linked.is_none());
            }
        }
    }

    #[test]
    fn an_unverified_or_untrusted_address_neither_links_nor_creates() {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            let trusted = asserted.has_email && asserted.email_verified && policy.trusts_email_verified;
            let d = decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref());
            if matches!(
                d,
                Decision::ProveFirst(_) | Decision::ProveMailbox(_) | Decision::Create
            ) {
                assert!(trusted, "{d:?} from {asserted:?} under {policy:?}");
                assert_eq!(intent, Intent::SignIn);
                assert!(linked.is_none());
            }
        }
    }

    #[test]
    fn an_account_is_created_only_where_the_provider_may_and_no_account_has_the_address() {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            if decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref()) == Decision::Create {
                assert!(policy.may_create && by_email.is_none() && linked.is_none());
            }
        }
    }

    #[test]
    fn a_disabled_account_is_never_signed_in_linked_or_offered_for_proof() {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            let d = decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref());
            // The account each outcome is about, as the store read it.
            let about = match (&d, &intent) {
                (Decision::SignIn(_), _) => linked.clone(),
                (Decision::ProveFirst(_) | Decision::ProveMailbox(_), _) => by_email.clone(),
                (Decision::Link(_), Intent::LinkTo(me)) => Some(me.clone()),
                _ => continue,
            };
            let (Decision::SignIn(id)
            | Decision::ProveFirst(id)
            | Decision::ProveMailbox(id)
            | Decision::Link(id)) = &d
            else {
                continue;
            };
            let about = about.expect("an outcome names an account it read");
            assert_eq!(&about.id, id);
            let disabled = about.disabled;
            assert!(!disabled, "{d:?}: {intent:?} {linked:?} {by_email:?}");
        }
    }

    #[test]
    fn an_account_whose_address_was_never_proved_is_only_ever_offered_to_the_mailbox_with_its_credentials_cleared(
    ) {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            let d = decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref());
            match &d {
                Decision::ProveFirst(_) => assert!(by_email.as_ref().unwrap().email_verified, "{d:?}"),
                Decision::ProveMailbox(_) => assert!(!by_email.as_ref().unwrap().email_verified, "{d:?}"),
                _ => {}
            }
        }
    }

    #[test]
    fn the_address_is_not_read_once_the_identity_is_linked_or_the_person_links_it_themselves() {
        for (intent, policy, asserted, linked, by_email) in every_case() {
            let read = decide(&intent, policy, asserted, linked.as_ref(), by_email.as_ref());
            let unread = decide(&intent, policy, asserted, linked.as_ref(), None);
            if linked.is_some() || matches!(intent, Intent::LinkTo(_)) {
                assert_eq!(read, unread, "{intent:?} {linked:?} {by_email:?}");
            }
        }
    }

    #[test]
    fn the_table_row_by_row() {
        let trusted = Policy {
            trusts_email_verified: true,
            may_create: true,
        };
        let verified = Asserted {
            has_email: true,
            email_verified: true,
        };
        let a = account("a", false);
        let b = account("b", false);
        let off = account("a", true);
        let sign_in = Intent::SignIn;
        assert_eq!(
            decide(&sign_in, trusted, verified, Some(&a), Some(&b)),
            Decision::SignIn("a".into())
        );
        assert_eq!(
            decide(&sign_in, trusted, verified, Some(&off), None),
            Decision::Refuse(Refusal::Disabled)
        );
        let unverified = Asserted {
            has_email: true,
            email_verified: false,
        };
        assert_eq!(
            decide(&sign_in, trusted, unverified, None, Some(&a)),
            Decision::Refuse(Refusal::UnverifiedEmail)
        );
        let untrusting = Policy {
            trusts_email_verified: false,
            ..trusted
        };
        assert_eq!(
            decide(&sign_in, untrusting, verified, None, Some(&a)),
            Decision::Refuse(Refusal::UnverifiedEmail)
        );
        assert_eq!(
            decide(&sign_in, trusted, verified, None, Some(&a)),
            Decision::ProveFirst("a".into())
        );
        assert_eq!(decide(&sign_in, trusted, verified, None, None), Decision::Create);
        let linked_only = Policy {
            may_create: false,
            ..trusted
        };
        assert_eq!(
            decide(&sign_in, linked_only, verified, None, None),
            Decision::Refuse(Refusal::NoAccount)
        );
        let link_a = Intent::LinkTo(a.clone());
        assert_eq!(
            decide(&link_a, untrusting, unverified, Some(&a), None),
            Decision::AlreadyLinked
        );
        assert_eq!(
            decide(&link_a, trusted, verified, Some(&b), None),
            Decision::Refuse(Refusal::LinkedElsewhere)
        );
        assert_eq!(
            decide(&link_a, untrusting, unverified, None, Some(&b)),
            Decision::Link("a".into())
        );
    }

    #[test]
    fn a_session_records_fed_and_only_a_trusted_upstreams_registered_methods() {
        let now = 1_800_000_000_000;
        let fresh = Some(now / 1000);
        let old = Some(now / 1000 - 86_400);
        let amr = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            session_amr(false, &amr(&["pwd", "mfa"]), fresh, now),
            ("fed".into(), false)
        );
        assert_eq!(
            session_amr(true, &amr(&["pwd", "mfa"]), fresh, now),
            ("fed pwd mfa".into(), true)
        );
        assert_eq!(
            session_amr(true, &amr(&["pwd", "mfa"]), old, now),
            ("fed pwd".into(), false)
        );
        assert_eq!(
            session_amr(true, &amr(&["pwd", "made-up", "fed", "pwd", "hwk"]), fresh, now),
            ("fed pwd hwk".into(), false)
        );
        assert_eq!(session_amr(true, &[], fresh, now), ("fed".into(), false));
    }

    #[test]
    fn an_upstreams_mfa_stands_for_the_second_factor_only_when_trusted_asserted_and_fresh() {
        let now = 1_800_000_000_000;
        let mfa = vec!["pwd".to_string(), "mfa".to_string()];
        let one = vec!["pwd".to_string(), "otp".to_string()];
        let just_now = Some(now / 1000 - 5);
        assert!(second_factor_asserted(true, &mfa, just_now, now));
        assert!(!second_factor_asserted(false, &mfa, just_now, now), "not trusted");
        assert!(!second_factor_asserted(true, &one, just_now, now), "no mfa");
        assert!(!second_factor_asserted(true, &[], just_now, now));
        assert!(!second_factor_asserted(true, &mfa, None, now), "no auth_time");
        let yesterday = Some(now / 1000 - 86_400);
        assert!(
            !second_factor_asserted(true, &mfa, yesterday, now),
            "an old session there"
        );
        let edge = Some((now - MFA_FRESH_MS) / 1000);
        assert!(second_factor_asserted(true, &mfa, edge, now));
        assert!(!second_factor_asserted(
            true,
            &mfa,
            Some((now - MFA_FRESH_MS) / 1000 - 1),
            now
        ));
        let ahead = Some(now / 1000 + 3_600);
        assert!(!second_factor_asserted(true, &mfa, ahead, now), "from the future");
    }
}
