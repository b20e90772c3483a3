//! Dashboard sessions: a login takes an API token, checks it against the configured tokens (in
//! constant time, by `auth::Tokens`), and opens a session held here in memory. The cookie
//! carries only a random session id (32 bytes from the OS); the table is keyed by the id's
//! SHA-256, so neither the token nor a usable id sits in the table. Each session has a random
//! CSRF token every form posts back, compared in constant time. Sessions end after
//! [`SESSION_TTL`], on logout, or when the process stops. Failed logins are counted per client
//! address with the API's invalid tokens (`limits::Failures`), not here.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use axum::http::header;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::api::Role;

/// The cookie's name.
pub(super) const COOKIE: &str = "homing_session";
/// How long a session lasts from its login.
pub(super) const SESSION_TTL: Duration = Duration::from_secs(8 * 3600);
/// The most sessions held at once; a login past it is refused until some expire.
const MAX_SESSIONS: usize = 10_000;

/// A logged-in operator, as the pages see it.
#[derive(Debug, Clone)]
pub(super) struct Session {
    /// The name of the token used to log in (never the token).
    pub name: String,
    /// Its role.
    pub role: Role,
    /// The CSRF token every form of this session carries.
    pub csrf: String,
    expires: Instant,
}

impl Session {
    /// Whether this session may take actions (cancel, retry, interrupt).
    pub fn operator(&self) -> bool {
        self.role >= Role::Operator
    }

    /// Whether this session may send messages into a thread (producer or operator).
    pub fn producer(&self) -> bool {
        self.role >= Role::Producer
    }

    /// Whether `presented` is this session's CSRF token (constant time).
    pub fn csrf_ok(&self, presented: &str) -> bool {
        bool::from(self.csrf.as_bytes().ct_eq(presented.as_bytes()))
    }
}

/// Why a session could not be opened for a right token.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum LoginRefused {
    /// The session table is full.
    Full,
    /// The OS gave no random bytes.
    NoRandom,
}

/// The sessions of this process.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    table: Mutex<HashMap<[u8; 32], Session>>,
}

/// 32 random bytes as 64 hex digits.
fn random_hex() -> Option<String> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn key(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    /// Opens a session for the token `name` of `role`, found by `auth::Tokens`. Returns the
    /// session id for the cookie.
    pub fn login(&self, name: String, role: Role) -> Result<String, LoginRefused> {
        let now = Instant::now();
        let id = random_hex().ok_or(LoginRefused::NoRandom)?;
        let csrf = random_hex().ok_or(LoginRefused::NoRandom)?;
        let Ok(mut table) = self.table.lock() else {
            return Err(LoginRefused::Full);
        };
        if table.len() >= MAX_SESSIONS {
            table.retain(|_, s| s.expires > now);
            if table.len() >= MAX_SESSIONS {
                return Err(LoginRefused::Full);
            }
        }
        table.insert(
            key(&id),
            Session {
                name,
                role,
                csrf,
                expires: now + SESSION_TTL,
            },
        );
        Ok(id)
    }

    /// The live session the request's cookie names, if any.
    pub fn get(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers)?;
        let table = self.table.lock().ok()?;
        table
            .get(&key(&id))
            .filter(|s| s.expires > Instant::now())
            .cloned()
    }

    /// Ends the session the request's cookie names.
    pub fn logout(&self, headers: &HeaderMap) {
        if let (Some(id), Ok(mut table)) = (cookie(headers), self.table.lock()) {
            table.remove(&key(&id));
        }
    }
}

/// The session id from the `Cookie` header(s).
fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE && value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()))
                .then(|| value.to_owned())
        })
}

/// The `Set-Cookie` value of a new session.
pub(super) fn set_cookie(id: &str) -> String {
    format!(
        "{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION_TTL.as_secs()
    )
}

/// The `Set-Cookie` value that clears the session cookie.
pub(super) fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(cookie: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, cookie.parse().unwrap());
        h
    }

    #[test]
    fn a_session_is_found_by_its_cookie_only_and_ends_on_logout() {
        let sessions = Sessions::default();
        let id = sessions.login("ops".into(), Role::Operator).unwrap();
        assert_eq!(id.len(), 64);
        let h = headers(&format!("other=1; {COOKIE}={id}"));
        let s = sessions.get(&h).unwrap();
        assert_eq!((s.name.as_str(), s.role), ("ops", Role::Operator));
        assert!(s.csrf_ok(&s.csrf.clone()) && !s.csrf_ok("") && !s.csrf_ok(&id));
        let mut forged = id.clone();
        forged.replace_range(0..1, if id.starts_with('0') { "1" } else { "0" });
        assert!(
            sessions
                .get(&headers(&format!("{COOKIE}={forged}")))
                .is_none()
        );
        assert!(sessions.get(&headers("homing_session=<script>")).is_none());
        sessions.logout(&h);
        assert!(sessions.get(&h).is_none());
        assert!(set_cookie(&id).contains("HttpOnly; SameSite=Strict"));
    }
}
