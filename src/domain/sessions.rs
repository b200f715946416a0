//! The sessions core: the one service that starts, rotates and ends
//! sessions, and mints the tokens of a session. Every way in (a password,
//! a second factor, a passkey, a verified email, an OAuth client) ends
//! here once its own rules have been passed.
//!
//! ```text
//!  start ──> Started ──(refresh: refresh.rs decides)──> rotated ... ──> ended
//!     │                                                  │ reuse of a rotated token
//!     ├──> Disabled (the account was disabled meanwhile)  └──> ended (refresh_reuse)
//!     └──> FactorRequired (the account has a factor this authentication lacks)
//! ```
//!
//! Whether a session may start is decided inside the statement that
//! stores it (`store::NewSession::second_factor`), so that a factor
//! confirmed or an account disabled while a login is under way is never
//! skipped. Refresh rotation is decided by `refresh::decide` alone: the
//! store applies a rotation only to the state it was decided on.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::refresh::{self, RefreshDecision, RefreshState, RefreshTokens};
use super::shared::Shared;
use super::tokens::{Authn, Issuer, Subject, Verified};
use super::AuthError;
use crate::clock::{now_ms, rfc3339};
use crate::crypto::{sha256, Sealer};
use crate::limits::PolicyName;
use crate::store::{LiveRotation, NewSession, RefreshRecord, SessionRecord, SessionStart, UserRecord};

/// The `client_id` claim of tokens issued through the first-party endpoints.
pub const FIRST_PARTY_CLIENT: &str = "latchkey";

/// The `client_id` claim of the tokens of a refresh token's session.
fn client_name(rec: &RefreshRecord) -> &str {
    rec.client_id.as_deref().unwrap_or(FIRST_PARTY_CLIENT)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TokenPair {
    pub access_token: String,
    pub token_type: &'static str,
    pub expires_in: u64,
    pub refresh_token: String,
    pub refresh_expires_in: u64,
    /// Only after a verification that set no password (two registrations
    /// contested the address before it was verified): `PASSWORD_REQUIRED`,
    /// and the session may set one with `POST /auth/password` without
    /// `current_password`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'static str>,
    /// The account the session is of (not in any answer).
    #[serde(skip)]
    pub user_id: String,
}

/// The status of a verification that set no password ([`TokenPair::status`]).
pub const PASSWORD_REQUIRED: &str = "PASSWORD_REQUIRED";

/// Where a request comes from: the client address (after the trusted
/// proxies) and its `User-Agent`, recorded on the sessions it starts.
#[derive(Clone, Debug)]
pub struct Origin {
    pub ip: IpAddr,
    pub user_agent: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Profile {
    pub id: String,
    pub email: String,
    pub name: Option<String>,
    pub email_verified: bool,
    /// RFC 3339 time, UTC.
    pub created_at: String,
}

/// A live session, as its user sees it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    /// The OAuth client it belongs to (`latchkey` for the first-party endpoints).
    pub client_id: String,
    /// RFC 3339 times, UTC.
    pub created_at: String,
    pub last_used_at: String,
    pub expires_at: String,
    /// The `User-Agent` and client address of the request that started it.
    pub user_agent: Option<String>,
    pub ip: Option<String>,
    /// Whether the access token of this request belongs to it.
    pub current: bool,
    /// How it was authenticated (RFC 8176 methods: `pwd`, `otp`, `mfa`, ...).
    pub amr: Vec<String>,
}

impl SessionInfo {
    fn of(s: SessionRecord, current_sid: &str) -> SessionInfo {
        SessionInfo {
            current: s.id == current_sid,
            id: s.id,
            client_id: s.client_id.unwrap_or_else(|| FIRST_PARTY_CLIENT.into()),
            created_at: rfc3339(s.created_at),
            last_used_at: rfc3339(s.last_used_at),
            expires_at: rfc3339(s.expires_at),
            user_agent: s.user_agent,
            ip: s.ip,
            amr: s
                .amr
                .split(' ')
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect(),
        }
    }
}

/// A live refresh token, as introspection shows it.
pub struct RefreshInfo {
    pub user_id: String,
    pub session_id: String,
    pub email: String,
    pub client_id: String,
    /// Unix milliseconds.
    pub expires_at: i64,
}

/// What became of a session [`Sessions::start`] tried to start.
pub enum Started {
    /// The session's tokens, and its id.
    Pair(TokenPair, String),
    /// The account was disabled after it was read (a cached copy, or a race).
    Disabled,
    /// The account has a second factor this authentication did not pass:
    /// no session; the login steps up (`mfa`).
    FactorRequired(Authn),
}

/// What an OAuth client is granted in the authorization code flow.
pub struct ClientGrant<'a> {
    pub client_id: &'a str,
    pub scope: &'a str,
    /// The browser session that signed the user in.
    pub parent: &'a str,
    /// The client's own lifetimes, where it has them: its access tokens',
    /// and its sessions' (never past the browser session's, which the
    /// store caps it at).
    pub access_ttl: Option<Duration>,
    pub session_ttl: Option<Duration>,
}

/// A session about to be stored, with the hash of its first refresh token.
pub struct SessionDraft {
    id: String,
    client_id: Option<String>,
    now: i64,
    /// Unix ms; the store may end it earlier (an application's session,
    /// with its browser session), and says when.
    pub expires_at: i64,
    token_hash: [u8; 32],
    user_agent: Option<String>,
    ip: String,
    pub authn: Authn,
    second_factor: bool,
    scope: Option<String>,
    parent_id: Option<String>,
    /// Its client's own access-token lifetime, if it has one.
    access_ttl: Option<Duration>,
}

impl SessionDraft {
    pub fn as_new<'a>(&'a self, user_id: &'a str) -> NewSession<'a> {
        NewSession {
            id: &self.id,
            user_id,
            client_id: self.client_id.as_deref(),
            now: self.now,
            expires_at: self.expires_at,
            token_hash: &self.token_hash,
            user_agent: self.user_agent.as_deref(),
            ip: Some(&self.ip),
            amr: &self.authn.amr,
            auth_time: self.authn.at_ms,
            second_factor: self.second_factor,
            scope: self.scope.as_deref(),
            parent_id: self.parent_id.as_deref(),
        }
    }
}

pub struct Sessions {
    shared: Arc<Shared>,
    tokens: Arc<Issuer>,
    refresh_ttl: Duration,
    /// A rotated refresh token still refreshes this long (a client's retry).
    refresh_grace: Duration,
    /// The form of refresh tokens: each names its session.
    refresh_tokens: RefreshTokens,
}

impl Sessions {
    pub fn new(
        shared: Arc<Shared>,
        tokens: Arc<Issuer>,
        refresh_ttl: Duration,
        refresh_grace: Duration,
        refresh_tokens: RefreshTokens,
    ) -> Sessions {
        Sessions {
            shared,
            tokens,
            refresh_ttl,
            refresh_grace,
            refresh_tokens,
        }
    }

    /// Starts a session of `user` authenticated as `authn` (`second_factor`:
    /// that included one), for `client_id` (`None`: the first-party
    /// endpoints).
    pub async fn start(
        &self,
        user: &UserRecord,
        client_id: Option<&str>,
        origin: &Origin,
        authn: Authn,
        second_factor: bool,
    ) -> Result<Started, AuthError> {
        let (session, refresh) = self.draft(client_id, origin, authn, second_factor);
        self.store_started(user, session, refresh).await
    }

    /// The session of an OAuth client signing a user in through the
    /// browser session `grant.parent` (the authorization code flow), not yet
    /// stored: it holds `grant.scope`, ends when the parent ends and no
    /// later, and starts in the transaction that spends the code
    /// (`Store::redeem_authorization_code`), which then answers with
    /// [`Self::pair`].
    pub fn draft_for_client(
        &self,
        grant: ClientGrant<'_>,
        origin: &Origin,
        authn: Authn,
    ) -> (SessionDraft, String) {
        let second_factor = authn.is_mfa();
        let (mut session, refresh) = self.draft(Some(grant.client_id), origin, authn, second_factor);
        session.scope = Some(grant.scope.to_string());
        session.parent_id = Some(grant.parent.to_string());
        session.access_ttl = grant.access_ttl;
        if let Some(ttl) = grant.session_ttl {
            session.expires_at = session.expires_at.min(session.now + ttl.as_millis() as i64);
        }
        (session, refresh)
    }

    async fn store_started(
        &self,
        user: &UserRecord,
        session: SessionDraft,
        refresh: String,
    ) -> Result<Started, AuthError> {
        let client_id = session.client_id.clone();
        Ok(
            match self
                .shared
                .store
                .create_session(&session.as_new(&user.id))
                .await?
            {
                SessionStart::Started => Started::Pair(
                    self.pair(
                        &user.id,
                        &user.email,
                        &session,
                        client_id.as_deref().unwrap_or(FIRST_PARTY_CLIENT),
                        refresh,
                    )?,
                    session.id.clone(),
                ),
                SessionStart::Disabled => Started::Disabled,
                SessionStart::FactorRequired => Started::FactorRequired(session.authn),
            },
        )
    }

    /// A session not yet stored, and its first refresh token: for a store
    /// operation that starts a session in its own transaction (a
    /// verification), which then answers with [`Self::pair`].
    pub fn draft(
        &self,
        client_id: Option<&str>,
        origin: &Origin,
        authn: Authn,
        second_factor: bool,
    ) -> (SessionDraft, String) {
        let session = uuid::Uuid::new_v4();
        let token = self.refresh_tokens.mint(&session, client_id);
        let now = now_ms();
        let draft = SessionDraft {
            id: session.to_string(),
            client_id: client_id.map(str::to_string),
            now,
            expires_at: now + self.refresh_ttl.as_millis() as i64,
            token_hash: sha256(token.as_bytes()),
            user_agent: origin.user_agent.clone(),
            ip: origin.ip.to_string(),
            authn,
            second_factor,
            scope: None,
            parent_id: None,
            access_ttl: None,
        };
        (draft, token)
    }

    /// The tokens of a session just stored from `session`.
    pub fn pair(
        &self,
        user_id: &str,
        email: &str,
        session: &SessionDraft,
        client_id: &str,
        refresh_token: String,
    ) -> Result<TokenPair, AuthError> {
        let subject = Subject {
            user_id,
            email,
            session_id: &session.id,
            client_id,
            authn: &session.authn,
            scope: session.scope.as_deref(),
            access_ttl: session.access_ttl,
        };
        self.token_pair(&subject, refresh_token, session.expires_at)
    }

    /// What introspection may tell `caller` of a refresh token: only the
    /// client it was issued to learns anything, and only while it
    /// refreshes; the email only with the `email` scope, as in its tokens.
    pub async fn introspect_refresh(
        &self,
        token: &str,
        caller: &str,
    ) -> Result<Option<RefreshInfo>, AuthError> {
        let Some(rec) = self.shared.store.refresh_token(&sha256(token.as_bytes())).await? else {
            return Ok(None);
        };
        if rec.client_id.as_deref() != Some(caller) {
            return Ok(None);
        }
        let grace = self.refresh_grace.as_millis() as i64;
        if !refresh::decide(RefreshState::from(&rec), now_ms(), grace).is_live() {
            return Ok(None);
        }
        Ok(Some(RefreshInfo {
            email: crate::domain::tokens::visible_email(rec.scope.as_deref(), &rec.email).to_string(),
            user_id: rec.user_id,
            session_id: rec.session_id,
            client_id: rec.client_id.unwrap_or_else(|| FIRST_PARTY_CLIENT.into()),
            expires_at: rec.session_expires_at,
        }))
    }

    /// Exchanges a refresh token for a new pair. A session belongs to the
    /// client that started it: first-party sessions refresh at
    /// `/auth/refresh` (`client_id` `None`), an OAuth client's only at
    /// `/oauth/token` with that client's authentication. The token names
    /// its session and client, so a token presented by another client is
    /// refused before any lookup and spends no limit.
    pub async fn refresh(&self, token: &str, client_id: Option<&str>) -> Result<TokenPair, AuthError> {
        self.refresh_with(token, client_id, None).await
    }

    /// [`Sessions::refresh`] for an OAuth client whose access tokens have
    /// a lifetime of their own (`access_ttl`).
    pub async fn refresh_for_client(
        &self,
        token: &str,
        client_id: &str,
        access_ttl: Option<Duration>,
    ) -> Result<TokenPair, AuthError> {
        self.refresh_with(token, Some(client_id), access_ttl).await
    }

    async fn refresh_with(
        &self,
        token: &str,
        client_id: Option<&str>,
        access_ttl: Option<Duration>,
    ) -> Result<TokenPair, AuthError> {
        let store = &self.shared.store;
        let hash = sha256(token.as_bytes());
        let grace = self.refresh_grace.as_millis() as i64;
        let Some(session) = self.refresh_tokens.session_of(token, client_id) else {
            // Not a token this service minted for this client.
            return Err(AuthError::InvalidToken);
        };
        // That session's limit first, then the lookup and the rotation of
        // a live token in one statement. What it did not rotate is decided
        // below.
        let session_id = session.to_string();
        let now = now_ms();
        self.shared
            .limiter
            .check(PolicyName::RefreshSession, &session_id)
            .await?;
        let next = self.refresh_tokens.mint(&session, client_id);
        let asked = LiveRotation {
            old: hash,
            new: sha256(next.as_bytes()),
            successor: Sealer::from_token(token, "successor").seal(next.as_bytes(), &hash),
            session_id: session_id.clone(),
            client_id: client_id.map(str::to_string),
            now,
        };
        let Some((mut rec, rotated)) = store.rotate_live_refresh(asked).await? else {
            return Err(AuthError::InvalidToken);
        };
        if rec.session_id != session_id || rec.client_id.as_deref() != client_id {
            return Err(AuthError::InvalidToken);
        }
        if rotated {
            return self.refreshed_pair(&rec, next, access_ttl);
        }
        let mut decision = refresh::decide(RefreshState::from(&rec), now, grace);
        if decision == RefreshDecision::Rotate {
            // Live by the decision, yet the statement above did not rotate
            // it (the two disagree only if the statement's condition and
            // `refresh::decide` drift apart, which a test of the store
            // checks): rotate it on the state just read.
            let next = self.refresh_tokens.mint(&session, rec.client_id.as_deref());
            let successor = Sealer::from_token(token, "successor").seal(next.as_bytes(), &hash);
            if store
                .rotate_refresh(&hash, &sha256(next.as_bytes()), &successor, now_ms())
                .await?
            {
                return self.refreshed_pair(&rec, next, access_ttl);
            }
            // Another request rotated it first: answer as it did.
            rec = store.refresh_token(&hash).await?.ok_or(AuthError::InvalidToken)?;
            decision = refresh::decide(RefreshState::from(&rec), now_ms(), grace);
        }
        match decision {
            RefreshDecision::ReturnSuccessor => {
                let next = rec
                    .successor
                    .as_deref()
                    .and_then(|s| Sealer::from_token(token, "successor").open(s, &hash))
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or(AuthError::InvalidToken)?;
                self.refreshed_pair(&rec, next, access_ttl)
            }
            RefreshDecision::Reuse => {
                tracing::warn!(session_id = %rec.session_id, "refresh token reused after rotation: session revoked");
                metrics::counter!("latchkey_refresh_reuse_total").increment(1);
                self.revoke(&rec.session_id, "refresh_reuse").await?;
                Err(AuthError::InvalidToken)
            }
            RefreshDecision::Invalid | RefreshDecision::Rotate => Err(AuthError::InvalidToken),
        }
    }

    /// Ends the first-party session of a refresh token; a token of an OAuth
    /// client is ended by that client at `/oauth/revoke`, and an unknown
    /// token is fine (the answer is the same).
    pub async fn logout(&self, token: &str) -> Result<(), AuthError> {
        self.revoke_refresh_token(token, None).await
    }

    /// Revokes the session of a refresh token (RFC 7009) if it is a
    /// first-party token or one issued to `caller`; others and unknown
    /// tokens are left alone (the answer is the same).
    pub async fn revoke_refresh_token(&self, token: &str, caller: Option<&str>) -> Result<(), AuthError> {
        let hash = sha256(token.as_bytes());
        if let Some(rec) = self.shared.store.refresh_token(&hash).await? {
            let mine = rec.client_id.is_none() || rec.client_id.as_deref() == caller;
            if mine && rec.session_revoked_at.is_none() {
                let reason = if caller.is_none() { "logout" } else { "revoked" };
                self.revoke(&rec.session_id, reason).await?;
            }
        }
        Ok(())
    }

    /// Revokes a session by id (an access token's `sid`).
    pub async fn revoke_session_of(&self, session_id: &str) -> Result<(), AuthError> {
        self.revoke(session_id, "revoked").await
    }

    /// Ends a session, and the sessions OAuth clients started from it.
    pub(crate) async fn revoke(&self, session_id: &str, reason: &str) -> Result<(), AuthError> {
        let ended = self
            .shared
            .store
            .revoke_session(session_id, reason, now_ms())
            .await?;
        self.shared.revocations.revoke(&ended).await;
        Ok(())
    }

    /// The caller's live sessions, newest first, the caller's own marked.
    pub async fn list(&self, token: &Verified) -> Result<Vec<SessionInfo>, AuthError> {
        let list = self
            .shared
            .store
            .live_sessions(&token.claims.sub, now_ms())
            .await?;
        Ok(list
            .into_iter()
            .map(|s| SessionInfo::of(s, &token.claims.sid))
            .collect())
    }

    /// Ends one of the caller's live sessions (the caller's own included):
    /// its refresh token stops working and its access tokens are refused
    /// everywhere, as after a logout. Another user's session, or one that
    /// is not live, is [`AuthError::NotFound`] alike.
    pub async fn end_one(&self, token: &Verified, session_id: &str) -> Result<(), AuthError> {
        // Session ids are UUIDs: anything else names no session.
        if uuid::Uuid::try_parse(session_id).is_err() {
            return Err(AuthError::NotFound("session"));
        }
        let ended = self
            .shared
            .store
            .revoke_user_session(&token.claims.sub, session_id, "ended_by_user", now_ms())
            .await?;
        if ended.is_empty() {
            return Err(AuthError::NotFound("session"));
        }
        self.shared.revocations.revoke(&ended).await;
        Ok(())
    }

    /// Ends every live session of the caller, or (`others`) every one but
    /// the caller's.
    pub async fn end_all(&self, token: &Verified, others: bool) -> Result<(), AuthError> {
        let keep = others.then_some(token.claims.sid.as_str());
        let ended = self
            .shared
            .store
            .revoke_user_sessions(&token.claims.sub, keep, "ended_by_user", now_ms(), None)
            .await?;
        self.shared.revocations.revoke(&ended).await;
        Ok(())
    }

    /// The account of a session's access token.
    pub async fn profile(&self, token: &Verified) -> Result<Profile, AuthError> {
        let Some(u) = self.shared.store.user_by_id(&token.claims.sub).await? else {
            return Err(AuthError::InvalidToken);
        };
        Ok(Profile {
            id: u.id,
            email: u.email,
            name: u.name,
            email_verified: u.email_verified_at.is_some(),
            created_at: rfc3339(u.created_at),
        })
    }

    /// The pair of a refresh: the session's own authentication carries on.
    fn refreshed_pair(
        &self,
        rec: &RefreshRecord,
        refresh_token: String,
        access_ttl: Option<Duration>,
    ) -> Result<TokenPair, AuthError> {
        let authn = Authn::new(&rec.amr, rec.auth_time);
        let subject = Subject {
            user_id: &rec.user_id,
            email: &rec.email,
            session_id: &rec.session_id,
            client_id: client_name(rec),
            authn: &authn,
            scope: rec.scope.as_deref(),
            access_ttl,
        };
        self.token_pair(&subject, refresh_token, rec.session_expires_at)
    }

    fn token_pair(
        &self,
        subject: &Subject<'_>,
        refresh_token: String,
        session_expires_at: i64,
    ) -> Result<TokenPair, AuthError> {
        let access_token = self.tokens.issue(subject)?;
        Ok(TokenPair {
            access_token,
            token_type: "Bearer",
            expires_in: subject.access_ttl.unwrap_or(self.tokens.access_ttl()).as_secs(),
            refresh_token,
            refresh_expires_in: ((session_expires_at - now_ms()).max(0) / 1000) as u64,
            status: None,
            message: None,
            user_id: subject.user_id.to_string(),
        })
    }
}
