//! The master secret's keyring: which secrets an instance holds, the check
//! that every instance holds the ones the database records, and the two
//! commands that change them (docs/operations.md, "The master secret").
//!
//! ```text
//!   K1 seals                 latchkey secret rotate          K2 seals, K1 opens
//!   (secret_check K1)  ───────────────────────────────────▶  (secret_check K2,
//!                            every sealed row resealed         previous [K1])
//!                            under K2                               │
//!                                                                   │ latchkey secret retire
//!                                                                   ▼
//!                                                          K2 alone; K1's code and
//!                                                          refresh-token MAC keys kept,
//!                                                          sealed under K2 (retired)
//! ```
//!
//! What the database holds sealed is sealed again under the new secret by
//! `rotate`. What others hold (refresh tokens, recovery codes, the pages'
//! cookies and forms) cannot be: those keyed by a MAC live as long as their
//! owners keep them, so the retired secret's two MAC keys stay; those
//! sealed (cookies, forms, ceremonies, an upstream journey) live minutes to
//! a browser session, and are refused after `retire` like expired ones.
//!
//! An instance starts only with the keyring the database records: the
//! current secret's check value, and the previous secrets' (sorted). So a
//! secret that seals what the others cannot open never serves.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::config::Config;
use crate::crypto::{
    b64url, b64url_decode, ct_eq, secret_check, Keyring, Resealed, RetiredMacKeys, Sealer, ServerKeys,
};
use crate::store::{KeyringRecord, SealedColumn, Store};

/// Beside `<data_dir>/secret.key`: the previous secrets, one base64url line
/// each, written by `latchkey secret rotate` and removed by `retire`.
pub const PREVIOUS_FILE: &str = "secret.previous";

const RETIRED_AAD: &[u8] = b"latchkey/retired-secret-keys";

fn previous_file(data_dir: &Path) -> PathBuf {
    data_dir.join(PREVIOUS_FILE)
}

/// The configured keyring, without its retired keys (they are in the
/// database): `LATCHKEY_SECRET_KEY` and `LATCHKEY_PREVIOUS_SECRET_KEYS`, or
/// `<data_dir>/secret.key` and `<data_dir>/secret.previous`. With `create`,
/// a missing `secret.key` is made (the first start); without, it is `None`.
pub fn configured(config: &Config, create: bool) -> anyhow::Result<Option<Keyring>> {
    let configured = config.secret_key.as_ref().map(|s| s.expose().as_slice());
    let current = if create {
        Some(crate::crypto::load_master_secret(configured, &config.data_dir)?)
    } else {
        crate::crypto::read_master_secret(configured, &config.data_dir)?
    };
    let Some(current) = current else { return Ok(None) };
    let mut previous: Vec<Vec<u8>> = if !keeps_files(config) {
        config
            .previous_secret_keys
            .iter()
            .map(|s| s.expose().clone())
            .collect()
    } else {
        read_previous_file(&config.data_dir)?
    };
    // A secret listed twice, or the current one again (a rotation stopped
    // between its two files), is one secret.
    let mut seen = vec![secret_check(&current)];
    previous.retain(|m| {
        let check = secret_check(m);
        let new = !seen.iter().any(|c| ct_eq(c, &check));
        seen.push(check);
        new
    });
    Ok(Some(Keyring {
        current,
        previous,
        retired: Vec::new(),
    }))
}

/// Whether the keyring is the files in `<data_dir>` (`secret.key`,
/// `secret.previous`), which the commands write themselves, rather than
/// settings the operator gives.
pub fn keeps_files(config: &Config) -> bool {
    config.secret_key.is_none() && config.previous_secret_keys.is_empty()
}

fn read_previous_file(data_dir: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let path = previous_file(data_dir);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| match b64url_decode(l.trim()) {
            Some(b) if b.len() >= 32 => Ok(b),
            _ => bail!(
                "{} line {}: not a base64url secret of 32 bytes or more",
                path.display(),
                i + 1
            ),
        })
        .collect()
}

/// The server's keys for serving: the configured keyring (a first start
/// makes `secret.key`), the retired keys the database keeps, and the check
/// that the database records this keyring.
pub async fn load(config: &Config, store: &Store) -> anyhow::Result<ServerKeys> {
    let mut ring = configured(config, true)
        .context("loading the master secret (LATCHKEY_SECRET_KEY or <data_dir>/secret.key)")?
        .ok_or_else(|| no_secret(config))?;
    let record = store.keyring_record().await?;
    ring.retired = open_retired(&record, &ServerKeys::of_ring(&ring).retired)?;
    let keys = ServerKeys::of_ring(&ring);
    check(store, &record, &keys).await?;
    Ok(keys)
}

fn open_retired(record: &KeyringRecord, sealer: &Sealer) -> anyhow::Result<Vec<RetiredMacKeys>> {
    let Some(sealed) = &record.retired else {
        return Ok(Vec::new());
    };
    sealer
        .open(sealed, RETIRED_AAD)
        .and_then(|b| RetiredMacKeys::from_bytes(&b))
        .context("the database's retired secret keys do not open under this keyring (another master secret?)")
}

/// The previous secrets' check values as the database records them: sorted,
/// so that the order they are configured in does not matter.
fn previous_record(keys: &ServerKeys) -> Vec<u8> {
    let mut checks = keys.previous_checks.clone();
    checks.sort();
    checks.concat()
}

fn mismatch() -> anyhow::Error {
    anyhow::anyhow!(
        "LATCHKEY_SECRET_KEY: this database was initialised (or last rotated) under another master secret; \
         every instance must use the same LATCHKEY_SECRET_KEY (or the same <data_dir>/secret.key)"
    )
}

/// Refuses to run under another keyring than the database records: the
/// current secret's check value stored by the first instance (or the last
/// rotation) must be this one's, and so must the previous secrets'. A
/// database from before the check value existed gets it now, unless its
/// signing keys show it was initialised under another secret (none unseals
/// here): the first instance to start must not decide for the others.
async fn check(store: &Store, record: &KeyringRecord, keys: &ServerKeys) -> anyhow::Result<()> {
    let stored = match &record.current {
        Some(v) => v.clone(),
        None => {
            if !keys.previous_checks.is_empty() {
                bail!(
                    "this database records no master secret yet: start it with one secret, without previous \
                     ones (LATCHKEY_PREVIOUS_SECRET_KEYS or <data_dir>/{PREVIOUS_FILE})"
                );
            }
            let signing = store.signing_keys().await?;
            if !signing.is_empty()
                && !signing
                    .iter()
                    .any(|k| crate::domain::tokens::can_unseal(k, &keys.signing_keys))
            {
                return Err(mismatch());
            }
            store
                .installation_value("secret_check", &keys.secret_check)
                .await
                .context("storing the master secret's check value")?
        }
    };
    if !ct_eq(&stored, &keys.secret_check) {
        if keys.previous_checks.iter().any(|c| ct_eq(c, &stored)) {
            bail!(
                "the database is still sealed under a previous master secret: run `latchkey secret rotate` \
                 (with every instance stopped) to seal it under the current one, then start the instances"
            );
        }
        return Err(mismatch());
    }
    if !ct_eq(&record.previous, &previous_record(keys)) {
        bail!(
            "this instance holds other previous master secrets (LATCHKEY_PREVIOUS_SECRET_KEYS or \
             <data_dir>/{PREVIOUS_FILE}) than the database records: {} recorded, {} here. Every instance \
             must hold the same keyring; after `latchkey secret retire` it holds none",
            record.previous.len() / 32,
            keys.previous_checks.len()
        );
    }
    Ok(())
}

/// What a pass over the sealed values found, per column.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resealing {
    pub column: &'static str,
    /// Sealed under an older secret, now under the current one.
    pub resealed: u64,
    /// Under the current secret already.
    pub current: u64,
    /// Opened by no secret of the keyring: left as they are (and named).
    pub unopenable: Vec<String>,
}

/// Seals every value the database keeps sealed under the keyring's current
/// secret. A row changed meanwhile is left to its writer, who sealed it
/// under whichever secret it held: run again after the instances restarted.
pub async fn reseal_all(store: &Store, keys: &ServerKeys) -> anyhow::Result<Vec<Resealing>> {
    let mut report = Vec::new();
    for column in SealedColumn::ALL {
        let (sealer, aad): (&Sealer, fn(&str) -> Vec<u8>) = match column {
            SealedColumn::Outbox => (&keys.outbox, |_| crate::mail::AAD.to_vec()),
            SealedColumn::Webhooks => (&keys.outbox, |_| crate::webhooks::AAD.to_vec()),
            SealedColumn::SigningKeys => (&keys.signing_keys, |kid| kid.as_bytes().to_vec()),
            SealedColumn::Factors => (&keys.factors, crate::domain::mfa::totp_aad),
            SealedColumn::Upstreams => (&keys.upstreams, crate::domain::federation::upstream_secret_aad),
        };
        let mut counts = Resealing {
            column: column.name(),
            ..Resealing::default()
        };
        for (key, sealed) in store.sealed_values(column).await? {
            match sealer.reseal(&sealed, &aad(&key)) {
                Resealed::Current => counts.current += 1,
                Resealed::Now(new) => {
                    if store.replace_sealed(column, &key, &sealed, &new).await? {
                        counts.resealed += 1;
                    }
                }
                Resealed::Unopenable => counts.unopenable.push(key),
            }
        }
        report.push(counts);
    }
    Ok(report)
}

/// What `latchkey secret rotate` or `retire` did.
#[derive(Debug)]
pub struct Changed {
    /// `rotate`: a new secret was made in `<data_dir>/secret.key`.
    pub new_file_secret: bool,
    pub resealed: Vec<Resealing>,
    /// `retire`: how many previous secrets were let go.
    pub retired: usize,
}

/// The database and its record, for the two commands: a database never
/// started has nothing to rotate.
async fn opened(config: &Config) -> anyhow::Result<(Store, KeyringRecord, Vec<u8>)> {
    let store = super::store(&config.database).await?;
    let record = store.keyring_record().await?;
    let stored = record
        .current
        .clone()
        .context("this database was never started: it has no master secret yet to rotate")?;
    Ok((store, record, stored))
}

pub(super) fn no_secret(config: &Config) -> anyhow::Error {
    anyhow::anyhow!(
        "no master secret: set LATCHKEY_SECRET_KEY, or LATCHKEY_DATA_DIR to where the service keeps secret.key \
         ({} has none)",
        config.data_dir.display()
    )
}

/// `latchkey secret rotate`: makes the keyring's current secret the one
/// that seals the database, and seals everything it holds under it.
///
/// With `LATCHKEY_SECRET_KEY`, the operator gives the new secret there and
/// the one it replaces in `LATCHKEY_PREVIOUS_SECRET_KEYS`. With
/// `<data_dir>/secret.key`, this makes the new one: the old secret moves to
/// `secret.previous` first, then a new `secret.key` takes its place (each
/// written whole, then renamed), then the database. Run again after a stop
/// in between, it finishes the same rotation.
pub async fn rotate(config: &Config, now: i64) -> anyhow::Result<Changed> {
    let (store, record, stored) = opened(config).await?;
    let mut ring = configured(config, false)?.ok_or_else(|| no_secret(config))?;
    let mut new_file_secret = false;
    if keeps_files(config) && ct_eq(&secret_check(&ring.current), &stored) {
        ring = make_file_secret(&config.data_dir, ring)?;
        new_file_secret = true;
    }
    let held = ServerKeys::of_ring(&ring);
    let holds = |check: &[u8]| held.previous_checks.iter().any(|c| ct_eq(c, check));
    if !ct_eq(&held.secret_check, &stored) && !holds(&stored) {
        bail!(
            "the database is sealed under a master secret this keyring does not hold: give the secret it \
             replaces in LATCHKEY_PREVIOUS_SECRET_KEYS (or <data_dir>/{PREVIOUS_FILE})"
        );
    }
    // A previous secret not yet retired may still seal something, and its
    // MAC keys are not kept yet: it stays in the keyring.
    if !record.previous.chunks(32).all(holds) {
        bail!(
            "the database records previous master secrets this keyring does not hold ({} recorded): keep \
             them in LATCHKEY_PREVIOUS_SECRET_KEYS (or <data_dir>/{PREVIOUS_FILE}) until `latchkey secret retire`",
            record.previous.len() / 32
        );
    }
    ring.retired = open_retired(&record, &held.retired)?;
    let keys = ServerKeys::of_ring(&ring);
    let resealed = reseal_all(&store, &keys).await?;
    let retired = match &record.retired {
        Some(sealed) => match keys.retired.reseal(sealed, RETIRED_AAD) {
            Resealed::Now(new) => Some(new),
            _ => Some(sealed.clone()),
        },
        None => None,
    };
    let next = KeyringRecord {
        current: Some(keys.secret_check.to_vec()),
        previous: previous_record(&keys),
        retired,
    };
    if !store
        .record_keyring(&stored, &next, "master_secret.rotated", now)
        .await?
    {
        bail!("another `latchkey secret` command changed the keyring meanwhile: nothing recorded; run again");
    }
    Ok(Changed {
        new_file_secret,
        resealed,
        retired: 0,
    })
}

/// A new `secret.key`, the old one kept in `secret.previous` (which is
/// written first: a stop in between leaves both secrets on disk).
fn make_file_secret(data_dir: &Path, ring: Keyring) -> anyhow::Result<Keyring> {
    let mut previous = vec![ring.current.clone()];
    previous.extend(ring.previous);
    let lines: String = previous.iter().map(|m| format!("{}\n", b64url(m))).collect();
    replace_private_file(&previous_file(data_dir), lines.as_bytes())?;
    let current = crate::crypto::random_bytes::<32>().to_vec();
    replace_private_file(&data_dir.join("secret.key"), &current)?;
    Ok(Keyring {
        current,
        previous,
        retired: ring.retired,
    })
}

/// Writes `bytes` to `path` whole: to a new file beside it (its owner's
/// only), synced, then renamed over it, then the directory synced.
fn replace_private_file(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let staged = path.with_extension("new");
    let _ = std::fs::remove_file(&staged);
    let mut f =
        crate::crypto::private_new_file(&staged).with_context(|| format!("creating {}", staged.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .with_context(|| format!("writing {}", staged.display()))?;
    std::fs::rename(&staged, path).with_context(|| format!("replacing {}", path.display()))?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).ok();
    }
    Ok(())
}

/// `latchkey secret retire`: lets the previous secrets go, once the
/// database is under the current one. What the database still holds under
/// them is sealed again first, and a second pass checks that nothing came
/// back under them meanwhile (an instance still serving with them); values
/// no secret opens stop it unless `force`. Their code and refresh-token MAC
/// keys stay, sealed under the current secret. With
/// `<data_dir>/secret.previous`, the file is renamed
/// `secret.retired-<unix time>` (keep it with the backups made under it);
/// with `LATCHKEY_PREVIOUS_SECRET_KEYS`, the operator removes them from
/// every instance's settings before starting them again.
pub async fn retire(config: &Config, now: i64, force: bool) -> anyhow::Result<Changed> {
    let (store, record, stored) = opened(config).await?;
    let mut ring = configured(config, false)?.ok_or_else(|| no_secret(config))?;
    let held = ServerKeys::of_ring(&ring);
    if !ct_eq(&held.secret_check, &stored) {
        if held.previous_checks.iter().any(|c| ct_eq(c, &stored)) {
            bail!("the database is still sealed under a previous secret: run `latchkey secret rotate` first");
        }
        return Err(mismatch());
    }
    ring.retired = open_retired(&record, &held.retired)?;
    let retired_already = |m: &Vec<u8>| ring.retired.contains(&RetiredMacKeys::of(m));
    let file_based = keeps_files(config);
    if record.previous.is_empty() && !ring.previous.is_empty() && ring.previous.iter().all(retired_already) {
        // Retired, but stopped before its file was put away: finish that.
        if file_based {
            put_away_previous_file(&config.data_dir, now)?;
        }
        return Ok(Changed {
            new_file_secret: false,
            resealed: Vec::new(),
            retired: 0,
        });
    }
    if !ct_eq(&record.previous, &previous_record(&held)) {
        bail!(
            "the previous master secrets held here are not the ones the database records ({} recorded, {} \
             here): retire with exactly the recorded ones, so that none is let go unretired",
            record.previous.len() / 32,
            held.previous_checks.len()
        );
    }
    let keys = ServerKeys::of_ring(&ring);
    let resealed = reseal_all(&store, &keys).await?;
    let lost: Vec<String> = resealed
        .iter()
        .flat_map(|r| r.unopenable.iter().map(move |k| format!("{} {k}", r.column)))
        .collect();
    if !lost.is_empty() && !force {
        bail!(
            "these sealed values open under no secret held: {}. They are lost either way; --force retires \
             regardless",
            lost.join(", ")
        );
    }
    let again = reseal_all(&store, &keys).await?;
    if again.iter().any(|r| r.resealed > 0) {
        bail!(
            "values were sealed under a previous secret while this ran: an instance is still serving with the \
             previous keyring. Stop every instance and run again"
        );
    }
    let mut retired = ring.retired.clone();
    for m in &ring.previous {
        if !retired_already(m) {
            retired.push(RetiredMacKeys::of(m));
        }
    }
    let next = KeyringRecord {
        current: Some(keys.secret_check.to_vec()),
        previous: Vec::new(),
        retired: Some(
            keys.retired
                .seal(&RetiredMacKeys::to_bytes(&retired), RETIRED_AAD),
        ),
    };
    if !store
        .record_keyring(&stored, &next, "master_secret.retired", now)
        .await?
    {
        bail!("another `latchkey secret` command changed the keyring meanwhile: nothing recorded; run again");
    }
    if file_based {
        put_away_previous_file(&config.data_dir, now)?;
    }
    Ok(Changed {
        new_file_secret: false,
        resealed,
        retired: ring.previous.len(),
    })
}

/// Renames `<data_dir>/secret.previous` to `secret.retired-<unix time>`:
/// out of the keyring, but kept for the backups made under those secrets.
fn put_away_previous_file(data_dir: &Path, now_ms: i64) -> anyhow::Result<()> {
    let to = data_dir.join(format!("secret.retired-{}", now_ms / 1000));
    match std::fs::rename(previous_file(data_dir), &to) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("moving <data_dir>/{PREVIOUS_FILE} to {}", to.display()))
        }
        _ => Ok(()),
    }
}
