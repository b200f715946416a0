//! Everything the database holds, as text, to look for secrets in it: the
//! SQLite files byte for byte (WAL included), or every row of every table on
//! PostgreSQL.

use crate::common::TestApp;

const TABLES: &[&str] = &[
    "users",
    "codes",
    "installation",
    "sessions",
    "refresh_tokens",
    "outbox",
    "signing_keys",
    "clients",
    "factors",
    "recovery_codes",
    "mfa_challenges",
    "events",
    "webhooks",
];

pub async fn database_text(app: &TestApp) -> String {
    let mut out = String::new();
    match &app.services.store.db {
        latchkey::store::Db::Sqlite(_) => {
            for entry in std::fs::read_dir(app.tmp.path()).unwrap() {
                let p = entry.unwrap().path();
                if p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("latchkey.db")
                {
                    out.push_str(&String::from_utf8_lossy(&std::fs::read(&p).unwrap()));
                }
            }
        }
        latchkey::store::Db::Postgres(p) => {
            for t in TABLES {
                let rows: Vec<(String,)> = sqlx::query_as(&format!("SELECT row_to_json(t)::text FROM {t} t"))
                    .fetch_all(&**p)
                    .await
                    .unwrap();
                for (r,) in rows {
                    out.push_str(&r);
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// Whether `needle` occurs in `hay` as a whole word (not inside a longer run
/// of letters and digits), so a 6-digit code does not match part of a timestamp.
pub fn contains_word(hay: &str, needle: &str) -> bool {
    let b = hay.as_bytes();
    hay.match_indices(needle).any(|(i, _)| {
        let before = i
            .checked_sub(1)
            .map(|j| b[j].is_ascii_alphanumeric())
            .unwrap_or(false);
        let after = b
            .get(i + needle.len())
            .map(|c| c.is_ascii_alphanumeric())
            .unwrap_or(false);
        !before && !after
    })
}
