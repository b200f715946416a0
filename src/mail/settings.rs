//! Mail settings: where mail goes (`mail`), who it is from, how long
//! undeliverable mail is kept.

use std::path::PathBuf;
use std::time::Duration;

use crate::settings::{secs, ConfigError, Secret, Source};

#[derive(Clone, Debug, PartialEq)]
pub enum MailConfig {
    Log,
    File(PathBuf),
    Smtp {
        host: String,
        port: u16,
        credentials: Option<(String, Secret<String>)>,
        from: String,
        tls: SmtpTls,
        /// Extra trusted root certificates (PEM), for a relay with a private CA.
        ca_file: Option<PathBuf>,
        /// The most one delivery may take, from connecting to the relay's
        /// last reply: a relay that accepts and then stops answering
        /// would otherwise hold the outbox's worker for ever.
        timeout: Duration,
    },
}

/// How mail reaches the SMTP relay. Real providers require TLS, and so does
/// latchkey unless plain text is asked for by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmtpTls {
    /// `smtps://`: TLS from the first byte (port 465 by default).
    Implicit,
    /// `smtp://`: STARTTLS, and no mail if the relay does not offer it.
    StartTls,
    /// `smtp://...?tls=none`: plain text (a relay on the same host or a test).
    None,
}

#[derive(Clone, Debug)]
pub struct MailSettings {
    pub transport: MailConfig,
    pub from: String,
    /// Mail given up on is kept this long as a dead letter.
    pub dead_letter_ttl: Duration,
}

impl MailSettings {
    pub fn read(src: &impl Source) -> Result<MailSettings, ConfigError> {
        let from = src.get("mail_from", "latchkey <no-reply@localhost>".to_string(), |s| {
            // Checked as the sink will parse it: a sender it refused would
            // make every message a dead letter.
            match s.parse::<lettre::message::Mailbox>() {
                Ok(_) => Ok(s.to_string()),
                Err(e) => Err(format!(
                    "{e}: expected an address such as Example <no-reply@example.com>"
                )),
            }
        })?;
        let mut transport = src.get("mail", MailConfig::Log, parse_mail)?;
        let mail_ca = src.get("mail_tls_ca_file", None, |s| Ok(Some(PathBuf::from(s))))?;
        let mail_timeout = src.get("mail_timeout_secs", Duration::from_secs(60), secs(1, 600))?;
        if let MailConfig::Smtp {
            from: smtp_from,
            ca_file,
            timeout,
            ..
        } = &mut transport
        {
            *smtp_from = from.clone();
            *ca_file = mail_ca;
            *timeout = mail_timeout;
        }
        Ok(MailSettings {
            transport,
            from,
            dead_letter_ttl: src.get(
                "mail_dead_letter_ttl_secs",
                Duration::from_secs(7 * 86_400),
                secs(60, 365 * 86_400),
            )?,
        })
    }
}

pub fn parse_mail(s: &str) -> Result<MailConfig, String> {
    if s == "log" {
        return Ok(MailConfig::Log);
    }
    if let Some(dir) = s.strip_prefix("file:") {
        if dir.is_empty() {
            return Err("file: needs a directory, e.g. file:./data/mail".into());
        }
        return Ok(MailConfig::File(PathBuf::from(dir)));
    }
    if s.starts_with("smtp://") || s.starts_with("smtps://") {
        let u = url::Url::parse(s).map_err(|e| format!("not a valid URL: {e}"))?;
        let host = u
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or("smtp:// needs a host")?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let implicit = u.scheme() == "smtps";
        let mut tls = if implicit {
            SmtpTls::Implicit
        } else {
            SmtpTls::StartTls
        };
        for (k, v) in u.query_pairs() {
            match (k.as_ref(), v.as_ref(), implicit) {
                ("tls", "none", false) => tls = SmtpTls::None,
                ("tls", "starttls", false) => tls = SmtpTls::StartTls,
                ("tls", _, _) => {
                    return Err("tls= takes starttls (the default) or none, and only with smtp://".into())
                }
                (other, _, _) => return Err(format!("unknown parameter {other:?} (known: tls)")),
            }
        }
        let port = u.port().unwrap_or(if implicit { 465 } else { 587 });
        let credentials = if u.username().is_empty() {
            None
        } else {
            let user = percent_decode(u.username());
            let pass = percent_decode(u.password().unwrap_or(""));
            Some((user, Secret(pass)))
        };
        return Ok(MailConfig::Smtp {
            host,
            port,
            credentials,
            from: String::new(),
            tls,
            ca_file: None,
            timeout: Duration::from_secs(60),
        });
    }
    Err("expected log, file:DIR, smtps://[user:pass@]host[:port] or smtp://[user:pass@]host[:port][?tls=none]".into())
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mail_settings_parse() {
        assert_eq!(
            parse_mail("file:/tmp/m").unwrap(),
            MailConfig::File("/tmp/m".into())
        );
        match parse_mail("smtp://a%40b:p@host:2525").unwrap() {
            MailConfig::Smtp {
                host,
                port,
                credentials,
                ..
            } => {
                assert_eq!((host.as_str(), port), ("host", 2525));
                assert_eq!(credentials.unwrap().0, "a@b");
            }
            other => panic!("{other:?}"),
        }
        assert!(parse_mail("carrier-pigeon").is_err());
        // TLS unless plain text is asked for by name.
        let tls = |s: &str| match parse_mail(s).unwrap() {
            MailConfig::Smtp { tls, port, .. } => (tls, port),
            other => panic!("{other:?}"),
        };
        assert_eq!(tls("smtp://relay.example"), (SmtpTls::StartTls, 587));
        assert_eq!(tls("smtps://relay.example"), (SmtpTls::Implicit, 465));
        assert_eq!(tls("smtp://127.0.0.1:2525?tls=none"), (SmtpTls::None, 2525));
        assert!(parse_mail("smtps://relay.example?tls=none").is_err());
        assert!(parse_mail("smtp://relay.example?tls=maybe").is_err());
    }

    #[test]
    fn a_sender_the_sink_would_refuse_stops_start_up_and_the_relay_has_a_time_limit() {
        use crate::settings::Sources;
        let read = |pairs: &[(&str, &str)]| MailSettings::read(&Sources::from_pairs(pairs.iter().copied()));
        for bad in ["nobody", "a@b@c", "Ex <no-reply@example.com", "@example.com"] {
            assert!(read(&[("mail_from", bad)]).is_err(), "{bad}");
        }
        let s = read(&[
            ("mail_from", "Example <no-reply@example.com>"),
            ("mail", "smtp://relay.example"),
            ("mail_timeout_secs", "5"),
        ])
        .unwrap();
        match s.transport {
            MailConfig::Smtp { timeout, from, .. } => {
                assert_eq!(timeout, Duration::from_secs(5));
                assert_eq!(from, "Example <no-reply@example.com>");
            }
            other => panic!("{other:?}"),
        }
        assert!(read(&[("mail", "smtp://relay.example"), ("mail_timeout_secs", "0")]).is_err());
    }
}
