//! Where mail goes: the log (development), `.eml` files, or SMTP.

use std::path::PathBuf;
use std::time::Duration;

use lettre::message::{header::ContentType, Mailbox};
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

use super::Message;
use super::{MailConfig, SmtpTls};

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Retrying cannot help (a malformed address).
    #[error("permanent: {0}")]
    Permanent(String),
    /// The server refused this message for now (a 4xx reply: greylisting,
    /// a full mailbox): this message waits, the others do not.
    #[error("temporary: {0}")]
    Temporary(String),
    /// The relay could not be reached or did not answer (connection
    /// refused, a timeout, TLS): every message waits until it is back.
    #[error("unreachable: {0}")]
    Unreachable(String),
}

pub enum MailSink {
    /// Logs each message, code included: for development only.
    Log,
    File(PathBuf),
    /// The relay, and the most one delivery may take (lettre's own timeout
    /// bounds only the connection's opening).
    Smtp(AsyncSmtpTransport<Tokio1Executor>, Duration),
}

impl MailSink {
    pub fn new(cfg: &MailConfig) -> anyhow::Result<MailSink> {
        Ok(match cfg {
            MailConfig::Log => MailSink::Log,
            MailConfig::File(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| anyhow::anyhow!("LATCHKEY_MAIL: creating {}: {e}", dir.display()))?;
                MailSink::File(dir.clone())
            }
            MailConfig::Smtp {
                host,
                port,
                credentials,
                tls,
                ca_file,
                timeout,
                ..
            } => {
                let mut b = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host.as_str())
                    .port(*port)
                    .timeout(Some(Duration::from_secs(10)));
                let params = || -> anyhow::Result<TlsParameters> {
                    let mut p = TlsParameters::builder(host.clone());
                    if let Some(path) = ca_file {
                        let pem = std::fs::read(path).map_err(|e| {
                            anyhow::anyhow!("LATCHKEY_MAIL_TLS_CA_FILE: reading {}: {e}", path.display())
                        })?;
                        p = p.add_root_certificate(Certificate::from_pem(&pem).map_err(|e| {
                            anyhow::anyhow!("LATCHKEY_MAIL_TLS_CA_FILE: {}: {e}", path.display())
                        })?);
                    }
                    Ok(p.build_rustls()?)
                };
                b = b.tls(match tls {
                    SmtpTls::Implicit => Tls::Wrapper(params()?),
                    SmtpTls::StartTls => Tls::Required(params()?),
                    SmtpTls::None => {
                        tracing::warn!(
                            "LATCHKEY_MAIL: tls=none, mail and SMTP credentials travel in plain text"
                        );
                        Tls::None
                    }
                });
                if let Some((user, pass)) = credentials {
                    b = b.credentials(Credentials::new(user.clone(), pass.expose().clone()));
                }
                MailSink::Smtp(b.build(), *timeout)
            }
        })
    }

    pub fn kind(&self) -> &'static str {
        match self {
            MailSink::Log => "log",
            MailSink::File(_) => "file",
            MailSink::Smtp(..) => "smtp",
        }
    }

    /// Delivers `m`, queued as outbox row `id`, with the Message-ID
    /// `<message_id@domain of from>` (see [`Message::id_of`]).
    pub async fn deliver(&self, from: &str, id: i64, message_id: &str, m: &Message) -> Result<(), SinkError> {
        match self {
            MailSink::Log => {
                tracing::info!(target: "latchkey::mail", to = %m.to, subject = %m.subject,
                    "mail (log sink, development only):\n{}", m.body);
                Ok(())
            }
            MailSink::File(dir) => {
                let email = build(from, message_id, m)?;
                let name = format!("{}-{id:010}.eml", crate::clock::now_ms());
                let tmp = dir.join(format!(".{name}.tmp"));
                let bytes = email.formatted();
                if let Err(e) = tokio::fs::write(&tmp, &bytes).await {
                    // A part written to a full disk is removed: each retry
                    // writes under a new name, and would leave one more.
                    let _ = tokio::fs::remove_file(&tmp).await;
                    return Err(SinkError::Temporary(format!("writing {}: {e}", tmp.display())));
                }
                tokio::fs::rename(&tmp, dir.join(&name))
                    .await
                    .map_err(|e| SinkError::Temporary(format!("renaming {}: {e}", tmp.display())))?;
                Ok(())
            }
            MailSink::Smtp(transport, timeout) => {
                let email = build(from, message_id, m)?;
                // A relay that stops answering is unreachable. (If it had
                // stored the message already, the next delivery is a copy,
                // recognisable by its Message-ID.)
                match tokio::time::timeout(*timeout, transport.send(email)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) if e.is_permanent() => Err(SinkError::Permanent(e.to_string())),
                    Ok(Err(e)) if e.is_transient() => Err(SinkError::Temporary(e.to_string())),
                    Ok(Err(e)) => Err(SinkError::Unreachable(e.to_string())),
                    Err(_) => Err(SinkError::Unreachable(format!(
                        "the relay did not finish the delivery within {} s",
                        timeout.as_secs()
                    ))),
                }
            }
        }
    }
}

fn build(from: &str, message_id: &str, m: &Message) -> Result<lettre::Message, SinkError> {
    let from: Mailbox = from
        .parse()
        .map_err(|e| SinkError::Permanent(format!("from address: {e}")))?;
    // The sender's domain, in its ASCII (IDNA) form: a header may not carry
    // other characters, and lettre would encode them into no valid msg-id.
    let domain = match url::quirks::domain_to_ascii(from.email.domain()) {
        d if d.is_empty() => "localhost".to_string(),
        d => d,
    };
    let message_id = format!("<{message_id}@{domain}>");
    // The recipient is a plain address (never a mailbox with a display
    // name that could route elsewhere).
    let to = Mailbox::new(
        None,
        m.to.parse::<lettre::Address>()
            .map_err(|e| SinkError::Permanent(format!("to address: {e}")))?,
    );
    lettre::Message::builder()
        .from(from)
        .to(to)
        .subject(m.subject.clone())
        .message_id(Some(message_id))
        .header(ContentType::TEXT_PLAIN)
        .body(m.body.clone())
        .map_err(|e| SinkError::Permanent(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Sealer;

    #[test]
    fn every_delivery_of_a_queued_message_carries_its_one_message_id() {
        let sealer = Sealer::new(&[3u8; 32]);
        let m = Message::verification("ada@example.com", "123456");
        let queued = m.seal(&sealer);
        let header = |sealed: &[u8]| {
            let email = build("latchkey <no-reply@mail.example>", &Message::id_of(sealed), &m).unwrap();
            let text = String::from_utf8(email.formatted()).unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("Message-ID: ").map(str::to_owned))
                .expect("a Message-ID header")
        };
        let first = header(&queued);
        assert_eq!(first, header(&queued), "a second delivery is a copy");
        assert!(
            first.starts_with('<') && first.ends_with("@mail.example>"),
            "{first}"
        );
        assert_eq!(first.len(), "<@mail.example>".len() + 32, "{first}");
        // The same words queued again (a resend) are another message.
        assert_ne!(first, header(&m.seal(&sealer)));
        // Nothing of the content shows: it is the digest of the sealed bytes.
        let digest = crate::crypto::sha256(&queued);
        assert_eq!(
            first,
            format!("<{}@mail.example>", crate::crypto::hex(&digest[..16]))
        );
        // A sender's domain of other characters than ASCII, in its IDNA form.
        let email = build("no-reply@bücher.example", &Message::id_of(&queued), &m).unwrap();
        let text = String::from_utf8(email.formatted()).unwrap();
        let id = format!("Message-ID: <{}@xn--bcher-kva.example>", Message::id_of(&queued));
        assert!(text.lines().any(|l| l == id), "{text}");
    }
}
