//! Small building blocks over `ring`: random tokens, digests, keyed hashes,
//! sealing (AES-256-GCM) and the master secret. No primitive is written here.

use std::path::Path;

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

/// A key for HMAC-SHA256, used for keyed hashes of codes and the credential cache.
#[derive(Clone)]
pub struct MacKey(hmac::Key);

impl MacKey {
    pub fn new(key: &[u8]) -> Self {
        MacKey(hmac::Key::new(hmac::HMAC_SHA256, key))
    }

    pub fn random() -> Self {
        MacKey::new(&random_bytes::<32>())
    }

    pub fn mac(&self, parts: &[&[u8]]) -> [u8; 32] {
        let mut ctx = hmac::Context::with_key(&self.0);
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

    /// An HMAC computed over bytes given in pieces, as they come (a file
    /// of any size, chunk by chunk). No length prefixes: the bytes as one.
    pub fn stream(&self) -> MacStream {
        MacStream(hmac::Context::with_key(&self.0))
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
pub struct Sealer(LessSafeKey);

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Self {
        Sealer(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, key).expect("32-byte key"),
        ))
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
        self.0
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
        if sealed.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = rest.to_vec();
        let plain = self.0.open_in_place(nonce, Aad::from(aad), &mut buf).ok()?;
        Some(plain.to_vec())
    }
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
    /// The seal of a backup's bytes (`latchkey backup`, docs/backup.md).
    pub backups: MacKey,
    /// Sealing of upstream providers' client secrets at rest, and of a
    /// sign-in's journey through an upstream (its cookie,
    /// docs/federation.md), each with its own associated data.
    pub upstreams: Sealer,
}

impl ServerKeys {
    pub fn derive(master: &[u8]) -> Self {
        let root = MacKey::new(master);
        ServerKeys {
            codes: MacKey::new(&root.mac(&[b"latchkey/codes/v1"])),
            outbox: Sealer::new(&root.mac(&[b"latchkey/outbox/v1"])),
            signing_keys: Sealer::new(&root.mac(&[b"latchkey/signing-keys/v1"])),
            factors: Sealer::new(&root.mac(&[b"latchkey/factors/v1"])),
            ceremonies: Sealer::new(&root.mac(&[b"latchkey/passkey-ceremony/v1"])),
            refresh_tokens: MacKey::new(&root.mac(&[b"latchkey/refresh-tokens/v1"])),
            authorizations: Sealer::new(&root.mac(&[b"latchkey/authorizations/v1"])),
            secret_check: root.mac(&[b"latchkey/secret-check/v1"]),
            backups: MacKey::new(&root.mac(&[b"latchkey/backups/v1"])),
            upstreams: Sealer::new(&root.mac(&[b"latchkey/upstreams/v1"])),
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
    fn mac_parts_are_length_prefixed() {
        let k = MacKey::new(b"k");
        assert_ne!(k.mac(&[b"ab", b"c"]), k.mac(&[b"a", b"bc"]));
        assert!(ct_eq(&k.mac(&[b"x"]), &k.mac(&[b"x"])));
        assert!(!ct_eq(b"a", b"ab"));
    }
}
