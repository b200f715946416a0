//! Small building blocks over `ring`: random tokens, digests, keyed hashes,
//! sealing (AES-256-GCM) and the master secret. No primitive is written here.

use std::path::Path;
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{digest, hmac};

pub fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    SystemRandom::new()
        .fill(&mut b)
        .expect("the operating system's CSPRNG failed");
    b
}

/// An opaque token with 256 bits of randomness, URL-safe.
pub fn random_token() -> String {
    URL_SAFE_NO_PAD.encode(random_bytes::<32>())
}

/// A uniformly random 6-digit code (rejection sampling, no modulo bias).
pub fn random_code() -> String {
    loop {
        let n = u32::from_le_bytes(random_bytes::<4>());
        // 4_294_000_000 is the largest multiple of 1_000_000 below 2^32.
        if n < 4_294_000_000 {
            return format!("{:06}", n % 1_000_000);
        }
    }
}

pub fn sha256(data: &[u8]) -> [u8; 32] {
    let d = digest::digest(&digest::SHA256, data);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lower-case hexadecimal.
pub fn hex(data: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(data.len() * 2);
    for b in data {
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// The bytes of lower- or upper-case hex (`None`: not hex).
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

pub fn b64url(data: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(data)
}

pub fn b64url_decode(s: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s).ok()
}

/// Constant-time equality of two byte strings.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// A key for HMAC-SHA256, used for keyed hashes of codes and the credential
/// cache. One derived from the master secret also holds the same key of the
/// secrets before it ([`Keyring`]): [`MacKey::mac`] uses the current key
/// only, [`MacKey::macs`] gives the MAC under each, for checking a value
/// keyed before a rotation.
#[derive(Clone)]
pub struct MacKey {
    current: hmac::Key,
    older: Arc<[hmac::Key]>,
}

fn hmac_key(key: &[u8]) -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, key)
}

fn mac_with(key: &hmac::Key, parts: &[&[u8]]) -> [u8; 32] {
    let mut ctx = hmac::Context::with_key(key);
    for p in parts {
        // Length-prefix every part so that ("ab","c") and ("a","bc") differ.
        ctx.update(&(p.len() as u64).to_be_bytes());
        ctx.update(p);
    }
    let tag = ctx.sign();
    let mut out = [0u8; 32];
    out.copy_from_slice(tag.as_ref());
    out
}

impl MacKey {
    pub fn new(key: &[u8]) -> Self {
        MacKey {
            current: hmac_key(key),
            older: Arc::from([]),
        }
    }

    /// `keys[0]` keys everything new; the others only check.
    fn ring(keys: &[[u8; 32]]) -> Self {
        MacKey {
            current: hmac_key(&keys[0]),
            older: keys[1..].iter().map(|k| hmac_key(k)).collect(),
        }
    }

    pub fn random() -> Self {
        MacKey::new(&random_bytes::<32>())
    }

    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        mac_with(&self.current, parts)
    }

    /// The MAC of `parts` under the current key, then under each older
    /// one: a stored value keyed before a rotation matches one of them.
    pub fn macs<'a>(&'a self, parts: &'a [&'a [u8]]) -> impl Iterator<Item = [u8; 32]> + 'a {
        std::iter::once(&self.current)
            .chain(self.older.iter())
            .map(move |k| mac_with(k, parts))
    }

    /// Whether `tag` (all of a MAC, or its first 16 bytes or more) is the
    /// MAC of `parts` under any of the keys, compared in constant time.
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        if !(16..=32).contains(&tag.len()) {
            return false;
        }
        // Every key is tried, so the time does not tell which one matched.
        self.macs(parts)
            .fold(false, |ok, mac| ok | ct_eq(&mac[..tag.len()], tag))
    }

    /// An HMAC computed over bytes given in pieces, as they come (a file
    /// of any size, chunk by chunk). No length prefixes: the bytes as one.
    /// Under the current key only.
    pub fn stream(&self) -> MacStream {
        MacStream(hmac::Context::with_key(&self.current))
    }
}

/// A [`MacKey::stream`] in progress.
pub struct MacStream(hmac::Context);

impl MacStream {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> [u8; 32] {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.sign().as_ref());
        out
    }
}

/// Authenticated encryption with a random nonce; output is `nonce || ciphertext || tag`.
/// One derived from the master secret also holds the same key of the
/// secrets before it ([`Keyring`]): it seals under the current key and
/// opens under any (AES-GCM's tag tells a wrong key, so trying is safe).
pub struct Sealer {
    current: LessSafeKey,
    older: Vec<LessSafeKey>,
}

fn aead_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("32-byte key"))
}

fn open_with(key: &LessSafeKey, sealed: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < NONCE_LEN {
        return None;
    }
    let (nonce, rest) = sealed.split_at(NONCE_LEN);
    let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
    let mut buf = rest.to_vec();
    let plain = key.open_in_place(nonce, Aad::from(aad), &mut buf).ok()?;
    Some(plain.to_vec())
}

/// What [`Sealer::reseal`] made of a sealed value.
#[derive(Debug, PartialEq, Eq)]
pub enum Resealed {
    /// Sealed under the current key already: nothing to do.
    Current,
    /// Opened under an older key: here it is, sealed under the current one.
    Now(Vec<u8>),
    /// No key here opens it (damaged, or sealed under a secret not held).
    Unopenable,
}

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Self {
        Sealer {
            current: aead_key(key),
            older: Vec::new(),
        }
    }

    /// `keys[0]` seals; every key opens.
    fn ring(keys: &[[u8; 32]]) -> Self {
        Sealer {
            current: aead_key(&keys[0]),
            older: keys[1..].iter().map(aead_key).collect(),
        }
    }

    /// A sealer whose key is derived from a high-entropy token (used to keep a
    /// refresh token's successor readable only by whoever holds the token).
    pub fn from_token(token: &str, label: &str) -> Self {
        let key = MacKey::new(token.as_bytes()).mac(&[label.as_bytes()]);
        Sealer::new(&key)
    }

    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Vec<u8> {
        let nonce_bytes = random_bytes::<NONCE_LEN>();
        let mut buf = plaintext.to_vec();
        self.current
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce_bytes),
                Aad::from(aad),
                &mut buf,
            )
            .expect("sealing cannot fail for in-memory buffers");
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&buf);
        out
    }

    pub fn open(&self, sealed: &[u8], aad: &[u8]) -> Option<Vec<u8>> {
        std::iter::once(&self.current)
            .chain(&self.older)
            .find_map(|k| open_with(k, sealed, aad))
    }

    /// `sealed` under the current key: as it is if it already was, sealed
    /// again if an older key opens it (`latchkey secret rotate`).
    pub fn reseal(&self, sealed: &[u8], aad: &[u8]) -> Resealed {
        if open_with(&self.current, sealed, aad).is_some() {
            return Resealed::Current;
        }
        match self.older.iter().find_map(|k| open_with(k, sealed, aad)) {
            Some(plain) => Resealed::Now(self.seal(&plain, aad)),
            None => Resealed::Unopenable,
        }
    }
}

/// The master secrets an instance holds. `current` seals and keys
/// everything new; each of `previous` (secrets before a rotation, until
/// `latchkey secret retire`) still opens and checks what it sealed or keyed.
/// `retired` are the keyed hashes' keys of secrets already retired, kept
/// (sealed under the current secret, in the database) because what they
/// keyed cannot be keyed again: recovery codes and refresh tokens are held
/// by their owners, only their MACs here. docs/operations.md, "The master
/// secret".
#[derive(Clone)]
pub struct Keyring {
    pub current: Vec<u8>,
    pub previous: Vec<Vec<u8>>,
    pub retired: Vec<RetiredMacKeys>,
}

/// The keys of a retired secret that outlive it (see [`Keyring`]).
#[derive(Clone, PartialEq, Eq)]
pub struct RetiredMacKeys {
    pub codes: [u8; 32],
    pub refresh_tokens: [u8; 32],
}

const CODES_LABEL: &[u8] = b"latchkey/codes/v1";
const REFRESH_LABEL: &[u8] = b"latchkey/refresh-tokens/v1";

impl RetiredMacKeys {
    pub fn of(master: &[u8]) -> Self {
        RetiredMacKeys {
            codes: subkey(master, CODES_LABEL),
            refresh_tokens: subkey(master, REFRESH_LABEL),
        }
    }

    /// Their stored form: 64 bytes each, one after the other.
    pub fn to_bytes(list: &[RetiredMacKeys]) -> Vec<u8> {
        list.iter()
            .flat_map(|k| k.codes.iter().chain(&k.refresh_tokens))
            .copied()
            .collect()
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<Vec<RetiredMacKeys>> {
        if bytes.len() % 64 != 0 {
            return None;
        }
        Some(
            bytes
                .chunks(64)
                .map(|c| RetiredMacKeys {
                    codes: c[..32].try_into().expect("32 bytes"),
                    refresh_tokens: c[32..].try_into().expect("32 bytes"),
                })
                .collect(),
        )
    }
}

impl Keyring {
    pub fn single(master: &[u8]) -> Self {
        Keyring {
            current: master.to_vec(),
            previous: Vec::new(),
            retired: Vec::new(),
        }
    }

    fn secrets(&self) -> impl Iterator<Item = &[u8]> {
        std::iter::once(self.current.as_slice()).chain(self.previous.iter().map(Vec::as_slice))
    }

    /// The purpose's key of every secret, the current one first.
    fn subkeys(&self, label: &[u8]) -> Vec<[u8; 32]> {
        self.secrets().map(|m| subkey(m, label)).collect()
    }

    /// [`Self::subkeys`], then the retired secrets' keys of the purpose.
    fn mac_keys(&self, label: &[u8], retired: impl Fn(&RetiredMacKeys) -> [u8; 32]) -> MacKey {
        let mut keys = self.subkeys(label);
        keys.extend(self.retired.iter().map(retired));
        MacKey::ring(&keys)
    }
}

fn subkey(master: &[u8], label: &[u8]) -> [u8; 32] {
    MacKey::new(master).mac(&[label])
}

/// The check value of a master secret (see [`ServerKeys::secret_check`]).
pub fn secret_check(master: &[u8]) -> [u8; 32] {
    subkey(master, b"latchkey/secret-check/v1")
}

/// Keys derived from the master secret, one per purpose.
pub struct ServerKeys {
    /// Keyed hash of one-time codes.
    pub codes: MacKey,
    /// Sealing of queued mail (it may carry codes).
    pub outbox: Sealer,
    /// Sealing of private signing keys at rest.
    pub signing_keys: Sealer,
    /// Sealing of TOTP secrets at rest.
    pub factors: Sealer,
    /// Sealing of the state of a passwordless sign-in's ceremony into its
    /// token (anyone may ask for one: a key of its own).
    pub ceremonies: Sealer,
    /// The tag of the session id a refresh token carries.
    pub refresh_tokens: MacKey,
    /// Sealing of an authorization request carried through the sign-in
    /// pages, and the pages' CSRF tokens (docs/oidc.md).
    pub authorizations: Sealer,
    /// A value that names the master secret without revealing it: stored in
    /// the database by the first instance, compared by every later one.
    pub secret_check: [u8; 32],
    /// The check values of the keyring's previous secrets, in its order.
    pub previous_checks: Vec<[u8; 32]>,
    /// Sealing of the retired secrets' keys kept in the database
    /// ([`RetiredMacKeys`]).
    pub retired: Sealer,
    /// The seal of a backup's bytes (`latchkey backup`, docs/backup.md).
    /// The current secret's only: a backup seals one state of one secret.
    pub backups: MacKey,
    /// Sealing of upstream providers' client secrets at rest, and of a
    /// sign-in's journey through an upstream (its cookie,
    /// docs/federation.md), each with its own associated data.
    pub upstreams: Sealer,
}

impl ServerKeys {
    /// The keys of one master secret, with nothing before it.
    pub fn derive(master: &[u8]) -> Self {
        Self::of_ring(&Keyring::single(master))
    }

    /// The keys of a keyring: each seals or keys under the current secret,
    /// and opens or checks under every secret of the ring.
    pub fn of_ring(ring: &Keyring) -> Self {
        let sealer = |label: &[u8]| Sealer::ring(&ring.subkeys(label));
        ServerKeys {
            codes: ring.mac_keys(CODES_LABEL, |r| r.codes),
            outbox: sealer(b"latchkey/outbox/v1"),
            signing_keys: sealer(b"latchkey/signing-keys/v1"),
            factors: sealer(b"latchkey/factors/v1"),
            ceremonies: sealer(b"latchkey/passkey-ceremony/v1"),
            refresh_tokens: ring.mac_keys(REFRESH_LABEL, |r| r.refresh_tokens),
            authorizations: sealer(b"latchkey/authorizations/v1"),
            secret_check: secret_check(&ring.current),
            previous_checks: ring.previous.iter().map(|m| secret_check(m)).collect(),
            retired: sealer(b"latchkey/retired-keys/v1"),
            backups: MacKey::new(&subkey(&ring.current, b"latchkey/backups/v1")),
            upstreams: sealer(b"latchkey/upstreams/v1"),
        }
    }
}

/// The master secret if there is one (the configured one, or
/// `<data_dir>/secret.key`): never creates one, for the commands that work
/// on a deployment's data without starting it (a backup, a restore).
pub fn read_master_secret(configured: Option<&[u8]>, data_dir: &Path) -> anyhow::Result<Option<Vec<u8>>> {
    use anyhow::Context;
    if let Some(s) = configured {
        return Ok(Some(s.to_vec()));
    }
    let path = data_dir.join("secret.key");
    match std::fs::read(&path) {
        Ok(bytes) if bytes.len() >= 32 => Ok(Some(bytes)),
        Ok(_) => anyhow::bail!("{} is shorter than 32 bytes", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Creates `path`, which must not exist (a symbolic link there counts),
/// readable and writable by its owner only: for files that hold secrets or
/// password hashes (the master secret, backups, exports).
pub fn private_new_file(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    options.open(path)
}

/// The master secret: the configured one, or `<data_dir>/secret.key`, created
/// (mode 0600) with 32 random bytes on first start.
pub fn load_master_secret(configured: Option<&[u8]>, data_dir: &Path) -> anyhow::Result<Vec<u8>> {
    use anyhow::Context;
    if let Some(s) = read_master_secret(configured, data_dir)? {
        return Ok(s);
    }
    let path = data_dir.join("secret.key");
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    let secret = random_bytes::<32>().to_vec();
    match private_new_file(&path) {
        Ok(mut f) => {
            use std::io::Write;
            f.write_all(&secret)
                .and_then(|_| f.sync_all())
                .with_context(|| format!("writing {}", path.display()))?;
            Ok(secret)
        }
        // Another process created it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            Ok(std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?)
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_reads_back_what_hex_writes_and_nothing_else() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xfe, 0xff];
        assert_eq!(hex_decode(&hex(&bytes)), Some(bytes.to_vec()));
        assert_eq!(hex_decode("ABcd"), Some(vec![0xab, 0xcd]));
        for bad in ["0", "zz", "+1", "0g", "é0"] {
            assert_eq!(hex_decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn codes_are_six_digits() {
        for _ in 0..1000 {
            let c = random_code();
            assert_eq!(c.len(), 6);
            assert!(c.bytes().all(|b| b.is_ascii_digit()));
        }
    }

    #[test]
    fn tokens_carry_256_bits() {
        let t = random_token();
        assert_eq!(b64url_decode(&t).unwrap().len(), 32);
        assert_ne!(t, random_token());
    }

    #[test]
    fn seal_round_trip_and_tamper() {
        let s = Sealer::new(&[7u8; 32]);
        let sealed = s.seal(b"hello", b"aad");
        assert_eq!(s.open(&sealed, b"aad").unwrap(), b"hello");
        assert!(s.open(&sealed, b"other").is_none());
        let mut bad = sealed.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(s.open(&bad, b"aad").is_none());
        assert!(Sealer::new(&[8u8; 32]).open(&sealed, b"aad").is_none());
    }

    #[test]
    fn a_ring_seals_under_its_current_secret_and_opens_under_each() {
        let old = ServerKeys::derive(b"the old master secret, 32 bytes!");
        let ring = Keyring {
            current: b"the new master secret, 32 bytes!".to_vec(),
            previous: vec![b"the old master secret, 32 bytes!".to_vec()],
            retired: Vec::new(),
        };
        let both = ServerKeys::of_ring(&ring);
        let new = ServerKeys::derive(&ring.current);
        let sealed_before = old.factors.seal(b"totp", b"f1");
        assert_eq!(both.factors.open(&sealed_before, b"f1").unwrap(), b"totp");
        assert!(both.factors.open(&sealed_before, b"f2").is_none());
        assert!(new.factors.open(&sealed_before, b"f1").is_none());
        // What the ring seals opens under the new secret alone.
        let sealed_after = both.factors.seal(b"totp", b"f1");
        assert!(new.factors.open(&sealed_after, b"f1").is_some());
        assert!(old.factors.open(&sealed_after, b"f1").is_none());
        // Resealing: the old value moves, a current one stays, a foreign one is named.
        match both.factors.reseal(&sealed_before, b"f1") {
            Resealed::Now(v) => assert_eq!(new.factors.open(&v, b"f1").unwrap(), b"totp"),
            other => panic!("{other:?}"),
        }
        assert_eq!(both.factors.reseal(&sealed_after, b"f1"), Resealed::Current);
        let foreign = ServerKeys::derive(b"somebody else's secret, 32 bytes")
            .factors
            .seal(b"x", b"f1");
        assert_eq!(both.factors.reseal(&foreign, b"f1"), Resealed::Unopenable);
        // Each purpose has its own key: the outbox's does not open a factor.
        assert!(both.outbox.open(&sealed_before, b"f1").is_none());
    }

    #[test]
    fn a_ring_keys_macs_under_its_current_secret_and_checks_them_under_each_and_the_retired() {
        let old_secret = b"the old master secret, 32 bytes!";
        let old = ServerKeys::derive(old_secret);
        let before = old.codes.mac(&[b"code", b"123456"]);
        let ring = Keyring {
            current: b"the new master secret, 32 bytes!".to_vec(),
            previous: vec![old_secret.to_vec()],
            retired: Vec::new(),
        };
        let both = ServerKeys::of_ring(&ring);
        assert_ne!(both.codes.mac(&[b"code", b"123456"]), before);
        assert!(both.codes.verify(&[b"code", b"123456"], &before));
        assert!(
            both.codes.verify(&[b"code", b"123456"], &before[..16]),
            "a truncated tag"
        );
        assert!(!both.codes.verify(&[b"code", b"654321"], &before));
        assert!(
            !both.codes.verify(&[b"code", b"123456"], &before[..15]),
            "too short to be a tag"
        );
        assert!(!both.codes.verify(&[b"code", b"123456"], &[]));
        assert!(
            !both.refresh_tokens.verify(&[b"code", b"123456"], &before),
            "another purpose"
        );
        // Retired: the secret is gone, its MAC keys stay.
        let retired = Keyring {
            current: ring.current.clone(),
            previous: Vec::new(),
            retired: RetiredMacKeys::from_bytes(&RetiredMacKeys::to_bytes(&[RetiredMacKeys::of(old_secret)]))
                .unwrap(),
        };
        let after = ServerKeys::of_ring(&retired);
        assert!(after.codes.verify(&[b"code", b"123456"], &before));
        assert_eq!(after.codes.macs(&[b"code", b"123456"]).count(), 2);
        assert!(
            after.factors.open(&old.factors.seal(b"x", b"a"), b"a").is_none(),
            "nothing sealed opens"
        );
        assert!(RetiredMacKeys::from_bytes(&[0u8; 63]).is_none());
    }

    #[test]
    fn one_secret_derives_the_keys_it_always_did() {
        // The keys before keyrings: HMAC(master, label). Changing them would
        // make every stored hash and sealed value unreadable.
        let master = b"a master secret of 32 bytes here";
        let root = MacKey::new(master);
        let keys = ServerKeys::derive(master);
        assert_eq!(keys.secret_check, root.mac(&[b"latchkey/secret-check/v1"]));
        let codes = MacKey::new(&root.mac(&[b"latchkey/codes/v1"]));
        assert_eq!(keys.codes.mac(&[b"x"]), codes.mac(&[b"x"]));
        let factors = Sealer::new(&root.mac(&[b"latchkey/factors/v1"]));
        assert!(keys.factors.open(&factors.seal(b"s", b"a"), b"a").is_some());
        assert!(keys.previous_checks.is_empty());
    }

    #[test]
    fn mac_parts_are_length_prefixed() {
        let k = MacKey::new(b"k");
        assert_ne!(k.mac(&[b"ab", b"c"]), k.mac(&[b"a", b"bc"]));
        assert!(ct_eq(&k.mac(&[b"x"]), &k.mac(&[b"x"])));
        assert!(!ct_eq(b"a", b"ab"));
    }
}
