//! Reading settings: where values come from, how they are named in errors,
//! and the value parsers every part shares. Ground floor: imports nothing
//! from the crate.
//!
//! The service reads flat keys from the environment (`LATCHKEY_<KEY>`) over
//! an optional TOML file (`--config`); the gateway reads one TOML file with
//! tables. Both are a [`Source`], so a part that owns settings (the store
//! its database, the cache Redis, telemetry its log format, ...) reads them
//! with one function that serves the service and the gateway alike, with
//! the same messages. An invalid value stops start-up with one line that
//! names the setting ([`ConfigError`]). Secrets are wrapped in [`Secret`] so
//! that no `Debug` or log line can print them.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

/// A value that must never be printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret<T>(pub T);

impl<T> Secret<T> {
    pub fn expose(&self) -> &T {
        &self.0
    }
}

impl<T> fmt::Debug for Secret<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// An invalid setting: names it, says why, never echoes a secret value.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {name}: {message}")]
pub struct ConfigError {
    pub name: String,
    pub message: String,
}

impl ConfigError {
    pub fn new(name: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            name: name.into(),
            message: message.into(),
        }
    }
}

/// Where settings are read from. A value is text; a parser turns it into
/// its type or says, in one line, what was expected.
pub trait Source {
    /// The text of `key` and the name to report it under, if it is set.
    fn text(&self, key: &str) -> Result<Option<(String, String)>, ConfigError>;

    /// The items of list `key`, each with the name to report it under.
    fn items(&self, key: &str) -> Result<Option<Vec<(String, String)>>, ConfigError>;

    /// The name `key` is reported under when it is not set.
    fn name_of(&self, key: &str) -> String;

    /// Setting `key` parsed by `parse`, or `default` when it is not set.
    fn get<T>(
        &self,
        key: &str,
        default: T,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        match self.text(key)? {
            None => Ok(default),
            Some((v, name)) => parse(v.trim()).map_err(|m| ConfigError::new(name, m)),
        }
    }

    /// Setting `key` parsed by `parse`; an error naming it when it is not
    /// set, or set empty.
    fn required<T>(&self, key: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<T, ConfigError> {
        match self.text(key)? {
            Some((v, name)) if !v.trim().is_empty() => parse(v.trim()).map_err(|m| ConfigError::new(name, m)),
            Some((_, name)) => Err(ConfigError::new(name, "is required")),
            None => Err(ConfigError::new(self.name_of(key), "is required")),
        }
    }

    /// List `key` with each item parsed by `parse` (empty when not set).
    fn list<T>(&self, key: &str, parse: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, ConfigError> {
        self.items(key)?
            .unwrap_or_default()
            .into_iter()
            .map(|(v, name)| parse(&v).map_err(|m| ConfigError::new(name, m)))
            .collect()
    }
}

/// The service's settings: the environment and an optional TOML table.
///
/// Every setting has one key `k`. It is read from the environment as
/// `LATCHKEY_<K>` and from the TOML file (given with `--config`) as `k`;
/// the environment wins.
pub struct Sources {
    env: BTreeMap<String, String>,
    file: toml::Table,
}

impl Sources {
    /// The process environment plus the file at `path`, if any.
    pub fn load(path: Option<&Path>) -> Result<Sources, ConfigError> {
        let env = std::env::vars()
            .filter(|(k, _)| k.starts_with("LATCHKEY_") && !k.starts_with("LATCHKEY_TEST_"))
            .collect();
        let file = match path {
            None => toml::Table::new(),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| ConfigError::new("--config", format!("cannot read {}: {e}", p.display())))?;
                text.parse::<toml::Table>().map_err(|e| {
                    ConfigError::new(
                        "--config",
                        format!("{}: {}", p.display(), e.message().replace('\n', " ")),
                    )
                })?
            }
        };
        Ok(Sources { env, file })
    }

    /// Settings given explicitly (tests, embedding).
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Sources {
        Sources {
            env: pairs
                .into_iter()
                .map(|(k, v)| (env_name(k), v.to_string()))
                .collect(),
            file: toml::Table::new(),
        }
    }

    pub fn set(&mut self, key: &str, value: impl Into<String>) {
        self.env.insert(env_name(key), value.into());
    }

    /// Forgets the environment, keeping the file (tests of the file alone).
    pub fn clear_environment(&mut self) {
        self.env.clear();
    }

    pub fn file_table(&self, key: &str) -> Option<&toml::Table> {
        self.file.get(key).and_then(|v| v.as_table())
    }

    /// The file's value of `key`: `listen` and `LATCHKEY_LISTEN` are both accepted.
    fn file_value(&self, key: &str) -> Option<(String, &toml::Value)> {
        match self.file.get(key) {
            Some(v) => Some((key.to_string(), v)),
            None => self.file.get(&env_name(key)).map(|v| (env_name(key), v)),
        }
    }
}

fn env_name(key: &str) -> String {
    format!("LATCHKEY_{}", key.to_ascii_uppercase())
}

fn toml_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => format!("{other:?}"),
    }
}

impl Source for Sources {
    fn text(&self, key: &str) -> Result<Option<(String, String)>, ConfigError> {
        let env_name = env_name(key);
        if let Some(v) = self.env.get(&env_name) {
            return Ok(Some((v.clone(), env_name)));
        }
        Ok(self
            .file_value(key)
            .map(|(k, v)| (toml_text(v), format!("{k} (in the --config file)"))))
    }

    /// A comma-separated value, or an array in the file.
    fn items(&self, key: &str) -> Result<Option<Vec<(String, String)>>, ConfigError> {
        if let Some((k, toml::Value::Array(items))) = self.file_value(key) {
            if !self.env.contains_key(&env_name(key)) {
                let name = format!("{k} (in the --config file)");
                return Ok(Some(items.iter().map(|v| (toml_text(v), name.clone())).collect()));
            }
        }
        Ok(self.text(key)?.map(|(v, name)| {
            v.split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| (p.to_string(), name.clone()))
                .collect()
        }))
    }

    fn name_of(&self, key: &str) -> String {
        match self.text(key) {
            Ok(Some((_, name))) => name,
            _ => env_name(key),
        }
    }
}

// The shared value parsers. Each returns a parser for [`Source::get`].

/// A number between `min` and `max`.
pub fn number<T>(min: T, max: T) -> impl Fn(&str) -> Result<T, String>
where
    T: FromStr + PartialOrd + fmt::Display + Copy,
{
    move |s| {
        let v: T = s.parse().map_err(|_| format!("expected a number, got {s:?}"))?;
        if v < min || v > max {
            return Err(format!("must be between {min} and {max}"));
        }
        Ok(v)
    }
}

/// Whole seconds between `min` and `max`.
pub fn secs(min: u64, max: u64) -> impl Fn(&str) -> Result<Duration, String> {
    move |s| number(min, max)(s).map(Duration::from_secs)
}

/// Milliseconds between `min` and `max`.
pub fn millis(min: u64, max: u64) -> impl Fn(&str) -> Result<Duration, String> {
    move |s| number(min, max)(s).map(Duration::from_millis)
}

/// `on` or `off` (and the usual spellings of each).
pub fn switch(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "1" | "yes" => Ok(true),
        "off" | "false" | "0" | "no" => Ok(false),
        _ => Err(format!("expected on or off (true or false), got {s:?}")),
    }
}

/// One of the named `options`, spelled exactly.
pub fn one_of<T: Copy>(options: &'static [(&'static str, T)]) -> impl Fn(&str) -> Result<T, String> {
    move |s| {
        options
            .iter()
            .find(|(name, _)| *name == s)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<String> = options.iter().map(|(n, _)| format!("{n:?}")).collect();
                let (last, rest) = names.split_last().expect("options are listed");
                if rest.is_empty() {
                    format!("expected {last}, got {s:?}")
                } else {
                    format!("expected {} or {last}, got {s:?}", rest.join(", "))
                }
            })
    }
}

/// `host:port`; `example` shows the expected form in the message.
pub fn socket_addr(example: &'static str) -> impl Fn(&str) -> Result<SocketAddr, String> {
    move |s| {
        s.parse()
            .map_err(|_| format!("expected host:port such as {example}, got {s:?}"))
    }
}

/// An IP address (one item of `trusted_proxies`).
pub fn ip(s: &str) -> Result<IpAddr, String> {
    s.parse().map_err(|_| format!("{s:?} is not an IP address"))
}

/// A URL, kept as written but for a trailing slash.
pub fn url_text(s: &str) -> Result<String, String> {
    url::Url::parse(s)
        .map(|_| s.trim_end_matches('/').to_string())
        .map_err(|e| format!("not a URL: {e}"))
}

/// Text that must not be empty.
pub fn non_empty(s: &str) -> Result<String, String> {
    if s.is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(s.to_string())
    }
}

/// An optional value: empty text means unset.
pub fn optional<T>(parse: impl Fn(&str) -> Result<T, String>) -> impl Fn(&str) -> Result<Option<T>, String> {
    move |s| {
        if s.is_empty() {
            Ok(None)
        } else {
            parse(s).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_names_and_file_names_are_reported() {
        let src = Sources::from_pairs([("hash_threads", "many")]);
        let err = src.get("hash_threads", 1u32, number(1, 8)).unwrap_err();
        assert_eq!(err.name, "LATCHKEY_HASH_THREADS");
        assert_eq!(src.name_of("absent"), "LATCHKEY_ABSENT");
    }

    #[test]
    fn lists_come_comma_separated_or_as_arrays() {
        let src = Sources::from_pairs([("trusted_proxies", "10.0.0.1, ,10.0.0.2")]);
        let ips = src.list("trusted_proxies", ip).unwrap();
        assert_eq!(ips.len(), 2);
        let err = Sources::from_pairs([("trusted_proxies", "10.0.0.1,nope")])
            .list("trusted_proxies", ip)
            .unwrap_err();
        assert!(err.to_string().contains("\"nope\" is not an IP address"), "{err}");
    }

    #[test]
    fn secrets_do_not_print() {
        assert_eq!(format!("{:?}", Secret("hunter2")), "Secret(***)");
    }
}
