//! Mail: messages are sealed into the outbox in the transaction that causes
//! them (see `store::outbox`) and delivered by `OutboxWorker` through the sink
//! named by `LATCHKEY_MAIL`.

mod settings;
mod sink;
mod worker;

pub use settings::{MailConfig, MailSettings, SmtpTls};
pub use sink::{MailSink, SinkError};
pub use worker::OutboxWorker;

use serde::{Deserialize, Serialize};

use crate::crypto::Sealer;

/// A message as queued. It may carry a code, so it is stored sealed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Message {
    pub to: String,
    pub subject: String,
    pub body: String,
}

/// The associated data of sealed mail.
pub const AAD: &[u8] = b"latchkey/outbox";

impl Message {
    pub fn seal(&self, sealer: &Sealer) -> Vec<u8> {
        sealer.seal(&serde_json::to_vec(self).expect("a message serialises"), AAD)
    }

    pub fn open(sealed: &[u8], sealer: &Sealer) -> Option<Message> {
        serde_json::from_slice(&sealer.open(sealed, AAD)?).ok()
    }

    /// The left part of the Message-ID every delivery of the queued message
    /// `sealed` carries. The outbox delivers at least once: an instance that
    /// dies after the relay accepted a message and before its row is deleted
    /// leaves it to be sent again by another. Both copies then carry one
    /// Message-ID, so the second is recognisable as a copy, and mail systems
    /// that drop a Message-ID they already hold (Gmail's does) drop it.
    ///
    /// Taken from the SHA-256 of the sealed bytes: their random nonce makes
    /// it unique to the message, and it tells nothing of the content.
    pub fn id_of(sealed: &[u8]) -> String {
        crate::crypto::hex(&crate::crypto::sha256(sealed)[..16])
    }

    pub fn verification(to: &str, code: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "Your verification code".into(),
            body: format!(
                "Your verification code is:\n\n{code}\n\nIt is valid for 10 minutes and replaces \
                 any code sent before. If you did not create an account, ignore this email.\n"
            ),
        }
    }

    /// The verification code of a registration that contested the address:
    /// another sign-up for it was waiting for its code.
    pub fn verification_contested(to: &str, code: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "Your verification code".into(),
            body: format!(
                "Your verification code is:\n\n{code}\n\nIt is valid for 10 minutes and replaces \
                 any code sent before.\n\n\
                 Another sign-up for this address happened shortly before this one. To keep either \
                 from taking the account, entering this code verifies the address but sets no \
                 password: right after, you choose one. If you did not create an account, ignore \
                 this email.\n"
            ),
        }
    }

    pub fn already_registered(to: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "You already have an account".into(),
            body: "Someone tried to create an account with this email address, which already has one.\n\
                   If it was you, log in or reset your password. If not, you can ignore this email.\n"
                .into(),
        }
    }

    /// To the old address, when an administrator changed the account's email.
    pub fn email_changed(to: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "Your account's email address was changed".into(),
            body: "An administrator changed the email address of your account; this address no \
                   longer signs in to it, and your sessions have ended.\n\
                   If you did not ask for this, contact the service's support.\n"
                .into(),
        }
    }

    /// To the account, when its second factors changed (`what` says how).
    pub fn factors_changed(to: &str, what: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "The second factors of your account changed".into(),
            body: format!(
                "{what}\n\nIf this was not you, sign in and remove what you do not recognise, \
                 change your password, and contact the service's support.\n"
            ),
        }
    }

    /// A sign-in with another provider was linked to the account.
    pub fn identity_linked(to: &str, provider: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "A sign-in was linked to your account".into(),
            body: format!(
                "Your {provider} account can now sign in to your account here.\n\nIf this was not you, \
                 sign in, unlink it, change your password, and contact the service's support.\n"
            ),
        }
    }

    pub fn password_reset(to: &str, code: &str) -> Message {
        Message {
            to: to.to_string(),
            subject: "Your password reset code".into(),
            body: format!(
                "Your password reset code is:\n\n{code}\n\nIt is valid for 10 minutes. \
                 If you did not ask to reset your password, ignore this email.\n"
            ),
        }
    }
}
