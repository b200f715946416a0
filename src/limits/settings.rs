//! The limits' settings: whether limits apply at all, the named rate-limit
//! policies, and the brute-force thresholds.

use crate::settings::{number, switch, ConfigError, Source};

use super::{BruteForceRules, Policies};

#[derive(Clone, Debug)]
pub struct LimitSettings {
    /// `rate_limit = off` turns every rate limit and brute-force rule off
    /// (load tests of the bare path).
    pub enabled: bool,
    pub policies: Policies,
    /// Per (account, address).
    pub brute_force: BruteForceRules,
    /// Per account over every address (delays only).
    pub brute_force_account: BruteForceRules,
}

impl LimitSettings {
    pub fn read(src: &impl Source) -> Result<LimitSettings, ConfigError> {
        let brute_force = brute_force_rules(src)?;
        Ok(LimitSettings {
            enabled: src.get("rate_limit", true, switch)?,
            policies: Policies::read(src)?,
            brute_force_account: brute_force_account_rules(src, &brute_force)?,
            brute_force,
        })
    }
}

/// The brute-force thresholds (docs/design.md, "Security rules as pure state
/// machines"): the lock stays bounded (an hour at most), so that nobody can
/// keep a victim out for long.
fn brute_force_rules(src: &impl Source) -> Result<BruteForceRules, ConfigError> {
    let d = BruteForceRules::DEFAULT;
    let secs = |name: &str, default: i64, max: i64| src.get(name, default, number(1, max)).map(|s| s * 1000);
    let rules = BruteForceRules {
        free: src.get("brute_force_free_failures", d.free, number(0, 100))?,
        lock_at: src.get("brute_force_lock_after", d.lock_at, number(1, 1000))?,
        max_delay_ms: secs("brute_force_max_delay_secs", d.max_delay_ms / 1000, 3600)?,
        lock_ms: secs("brute_force_lock_secs", d.lock_ms / 1000, 3600)?,
        reset_after_ms: secs("brute_force_reset_secs", d.reset_after_ms / 1000, 86_400)?,
    };
    if rules.lock_at <= rules.free {
        return Err(ConfigError::new(
            src.name_of("brute_force_lock_after"),
            "must exceed brute_force_free_failures",
        ));
    }
    if rules.lock_ms < rules.max_delay_ms {
        return Err(ConfigError::new(
            src.name_of("brute_force_lock_secs"),
            "must be at least brute_force_max_delay_secs",
        ));
    }
    Ok(rules)
}

/// The account-wide thresholds: far above the per-address ones, growing
/// delays and no lock, so that distributed guessing is capped and nobody
/// can lock an owner out.
fn brute_force_account_rules(
    src: &impl Source,
    per_address: &BruteForceRules,
) -> Result<BruteForceRules, ConfigError> {
    let d = BruteForceRules::ACCOUNT_DEFAULT;
    let rules = BruteForceRules {
        free: src.get("brute_force_account_free_failures", d.free, number(1, 100_000))?,
        max_delay_ms: src.get(
            "brute_force_account_max_delay_secs",
            d.max_delay_ms / 1000,
            number(1, 3600),
        )? * 1000,
        reset_after_ms: src.get(
            "brute_force_account_reset_secs",
            d.reset_after_ms / 1000,
            number(60, 7 * 86_400),
        )? * 1000,
        ..d
    };
    if rules.free <= per_address.free {
        return Err(ConfigError::new(
            src.name_of("brute_force_account_free_failures"),
            "must exceed brute_force_free_failures (the account-wide count covers every address)",
        ));
    }
    Ok(rules)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Sources;

    fn read(pairs: Vec<(&str, &str)>) -> Result<LimitSettings, ConfigError> {
        LimitSettings::read(&Sources::from_pairs(pairs))
    }

    #[test]
    fn brute_force_rules_are_bounded_and_consistent() {
        let c = read(vec![]).unwrap();
        assert_eq!(c.brute_force, BruteForceRules::DEFAULT);
        let c = read(vec![
            ("brute_force_free_failures", "2"),
            ("brute_force_lock_after", "3"),
            ("brute_force_lock_secs", "4"),
            ("brute_force_max_delay_secs", "1"),
        ])
        .unwrap();
        assert_eq!((c.brute_force.free, c.brute_force.lock_at), (2, 3));
        assert_eq!(
            (c.brute_force.lock_ms, c.brute_force.max_delay_ms),
            (4_000, 1_000)
        );
        for (pairs, field) in [
            (vec![("brute_force_lock_secs", "3601")], "brute_force_lock_secs"),
            (vec![("brute_force_lock_secs", "0")], "brute_force_lock_secs"),
            (
                vec![("brute_force_free_failures", "-1")],
                "brute_force_free_failures",
            ),
            (
                vec![("brute_force_free_failures", "20")],
                "brute_force_lock_after",
            ),
            (vec![("brute_force_lock_secs", "30")], "brute_force_lock_secs"),
        ] {
            let e = read(pairs.clone()).unwrap_err();
            assert!(e.to_string().to_lowercase().contains(field), "{pairs:?}: {e}");
        }
    }

    #[test]
    fn rate_limit_switch() {
        let c = read(vec![("rate_limit", "off")]).unwrap();
        assert!(!c.enabled);
        assert!(read(vec![("rate_limit", "maybe")]).is_err());
    }
}
