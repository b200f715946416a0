//! TOTP (RFC 6238) as authenticator apps speak it: HMAC-SHA-1, 6 digits, 30 s
//! steps. Verification is a pure function of the secret, the code, the time
//! and the newest step already accepted (`now` passed in).
//!
//! ```text
//!  time steps:  ... |  t-1  |   t   |  t+1  | ...     t = now / 30 s
//!                       \______ a code may match any of these three
//!                               (one step of clock skew either way)
//!
//!  code matches step s:   s >  last_step  ->  Accepted(s)   store s as last_step
//!                         s <= last_step  ->  Replayed      that code, or an older one, was used
//!  no step matches                        ->  Wrong
//! ```
//!
//! Storing the accepted step, not the code, also refuses a code of an
//! earlier step after a later one was used: an observed code is dead as
//! soon as its owner has logged in with it or with any newer one.

use totp_rs::{Algorithm, TOTP};

use crate::crypto::ct_eq;

pub const STEP_SECS: i64 = 30;
pub const DIGITS: usize = 6;
/// Steps accepted either side of the current one.
pub const SKEW_STEPS: i64 = 1;
/// 160 bits, the size RFC 4226 recommends (and HMAC-SHA-1's block).
pub const SECRET_BYTES: usize = 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The code of this step, not used before: store it as the last step.
    Accepted { step: i64 },
    /// The code of a step at or before the last one accepted.
    Replayed,
    /// No step within the skew has this code (or it is not 6 digits).
    Wrong,
}

fn generator(secret: &[u8]) -> TOTP {
    TOTP::new_unchecked(
        Algorithm::SHA1,
        DIGITS,
        0,
        STEP_SECS as u64,
        secret.to_vec(),
        None,
        String::new(),
    )
}

/// The step of Unix time `now_ms`.
pub fn step_of(now_ms: i64) -> i64 {
    now_ms.div_euclid(1000 * STEP_SECS)
}

/// Judges `code` at `now_ms` against `secret`, given the newest step
/// accepted before (`None`: never). Every step of the window is computed
/// and compared in constant time, whichever matches.
pub fn check(secret: &[u8], code: &str, now_ms: i64, last_step: Option<i64>) -> Verdict {
    if code.len() != DIGITS || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Verdict::Wrong;
    }
    let totp = generator(secret);
    let now = step_of(now_ms);
    let mut matched = None;
    for step in now - SKEW_STEPS..=now + SKEW_STEPS {
        if step < 0 {
            continue;
        }
        let expected = totp.generate((step * STEP_SECS) as u64);
        if ct_eq(expected.as_bytes(), code.as_bytes()) {
            matched = Some(step);
        }
    }
    match matched {
        None => Verdict::Wrong,
        Some(s) if last_step.is_some_and(|last| s <= last) => Verdict::Replayed,
        Some(step) => Verdict::Accepted { step },
    }
}

/// The code of the step at `now_ms` (for tests and the reference page).
pub fn code_at(secret: &[u8], now_ms: i64) -> String {
    generator(secret).generate((step_of(now_ms) * STEP_SECS) as u64)
}

/// The `otpauth://totp/...` URI an authenticator app scans.
pub fn uri(secret: &[u8], issuer: &str, account: &str) -> String {
    TOTP::new_unchecked(
        Algorithm::SHA1,
        DIGITS,
        0,
        STEP_SECS as u64,
        secret.to_vec(),
        Some(issuer.to_string()),
        account.to_string(),
    )
    .get_url()
}

/// The secret as authenticator apps take it typed in: base32, no padding.
pub fn base32(secret: &[u8]) -> String {
    totp_rs::Secret::Raw(secret.to_vec()).to_encoded().to_string()
}

/// The URI as a QR code, an SVG document a page can show as it is.
pub fn qr_svg(uri: &str) -> Option<String> {
    let code = qrcode::QrCode::with_error_correction_level(uri.as_bytes(), qrcode::EcLevel::M).ok()?;
    Some(
        code.render::<qrcode::render::svg::Color<'_>>()
            .min_dimensions(200, 200)
            .quiet_zone(true)
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238 appendix B: the SHA-1 secret "12345678901234567890" and its
    /// 8-digit codes; authenticator apps show their last 6 digits.
    const RFC_SECRET: &[u8] = b"12345678901234567890";

    #[test]
    fn codes_are_those_of_rfc_6238() {
        for (t, eight) in [
            (59_i64, "94287082"),
            (1_111_111_109, "07081804"),
            (1_111_111_111, "14050471"),
            (1_234_567_890, "89005924"),
            (2_000_000_000, "69279037"),
        ] {
            assert_eq!(code_at(RFC_SECRET, t * 1000), eight[2..], "t = {t}");
        }
    }

    #[test]
    fn one_step_of_skew_either_way_and_no_more() {
        let now = 1_700_000_000_000;
        let s = step_of(now);
        for (offset, accepted) in [(-2, false), (-1, true), (0, true), (1, true), (2, false)] {
            let code = code_at(RFC_SECRET, now + offset * STEP_SECS * 1000);
            let v = check(RFC_SECRET, &code, now, None);
            if accepted {
                assert_eq!(v, Verdict::Accepted { step: s + offset }, "offset {offset}");
            } else {
                assert_eq!(v, Verdict::Wrong, "offset {offset}");
            }
        }
    }

    #[test]
    fn a_code_is_accepted_once_and_never_after_a_newer_one() {
        let now = 1_700_000_000_000;
        let s = step_of(now);
        let code = code_at(RFC_SECRET, now);
        assert_eq!(check(RFC_SECRET, &code, now, None), Verdict::Accepted { step: s });
        // The same code again, within its window or later in the skew.
        assert_eq!(check(RFC_SECRET, &code, now, Some(s)), Verdict::Replayed);
        assert_eq!(check(RFC_SECRET, &code, now + 30_000, Some(s)), Verdict::Replayed);
        // After the next step's code was used, the older one is dead too.
        let older = code_at(RFC_SECRET, now - 30_000);
        assert_eq!(check(RFC_SECRET, &older, now, Some(s)), Verdict::Replayed);
        // The next step's code is fine.
        let next = code_at(RFC_SECRET, now + 30_000);
        assert_eq!(
            check(RFC_SECRET, &next, now + 30_000, Some(s)),
            Verdict::Accepted { step: s + 1 }
        );
    }

    #[test]
    fn wrong_shapes_and_wrong_codes() {
        let now = 1_700_000_000_000;
        let good = code_at(RFC_SECRET, now);
        let wrong = format!("{:06}", (good.parse::<u32>().unwrap() + 1) % 1_000_000);
        for bad in [
            "",
            "12345",
            "1234567",
            "12345a",
            " 123456",
            "１２３４５６",
            &wrong,
        ] {
            assert_eq!(check(RFC_SECRET, bad, now, None), Verdict::Wrong, "{bad:?}");
        }
        assert_eq!(check(b"another secret of 20b", &good, now, None), Verdict::Wrong);
    }

    #[test]
    fn the_uri_names_the_issuer_and_the_account() {
        let u = uri(RFC_SECRET, "latchkey", "ada@example.com");
        assert!(u.starts_with("otpauth://totp/latchkey:ada%40example.com?"), "{u}");
        assert!(u.contains(&format!("secret={}", base32(RFC_SECRET))), "{u}");
        assert!(u.contains("issuer=latchkey"), "{u}");
        let svg = qr_svg(&u).unwrap();
        assert!(svg.starts_with("<?xml") && svg.contains("<svg"), "{}", &svg[..60]);
    }
}
