//! Bearer tokens: each configured token's secret is kept only as its SHA-256 digest, and a
//! presented token is hashed and compared against every digest in constant time (the digests
//! have one length, so neither the comparison nor the loop, which never stops early, tells how
//! much of a guess was right). Refusals are logged with the route and the reason, and with the
//! token's name when it was a known token of too small a role; never with the token. Invalid
//! tokens are counted per client address (`limits::Failures`, shared with the dashboard's
//! logins): past the limit a wrong token is answered 429 with `Retry-After`, and logged once
//! per run of failures; a valid token always passes.

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tracing::warn;

use super::limits::{ClientAddr, Failed};
use super::{ApiError, ApiState};
use crate::config::api::{Role, TokenConfig};
use crate::telemetry::API_REFUSALS;

/// One token as the server keeps it.
#[derive(Debug)]
struct Token {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// The configured tokens.
#[derive(Debug, Default)]
pub(super) struct Tokens(Vec<Token>);

/// Who called: the token's name and role.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The token's name.
    pub name: String,
    /// The token's role.
    pub role: Role,
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

impl Tokens {
    /// Reads every token's secret.
    pub(super) fn read(tokens: &[TokenConfig], base_dir: &Path) -> Result<Tokens, String> {
        let mut out: Vec<Token> = Vec::new();
        for token in tokens {
            let secret = token
                .secret
                .read(base_dir)
                .map_err(|e| format!("`{}`: {e}", token.name))?;
            let digest = digest(secret.expose());
            if let Some(other) = out
                .iter()
                .find(|t| bool::from(t.digest[..].ct_eq(&digest[..])))
            {
                return Err(format!(
                    "`{}` and `{}` have the same secret",
                    other.name, token.name
                ));
            }
            out.push(Token {
                name: token.name.clone(),
                role: token.role,
                digest,
            });
        }
        Ok(Tokens(out))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The name and role of the token `presented` is, if any (the dashboard's login).
    pub(super) fn identify(&self, presented: &[u8]) -> Option<(String, Role)> {
        self.find(presented).map(|t| (t.name.clone(), t.role))
    }

    /// The token `presented` is, if any: every digest is compared, whatever matches.
    fn find(&self, presented: &[u8]) -> Option<&Token> {
        let presented = digest(presented);
        let mut found = None;
        for token in &self.0 {
            if bool::from(token.digest[..].ct_eq(&presented[..])) {
                found = Some(token);
            }
        }
        found
    }
}

fn refuse(
    reason: &'static str,
    request: &Request,
    error: ApiError,
    name: Option<&str>,
) -> Response {
    refused(reason, request.method(), request.uri().path(), error, name)
}

/// Counts and logs a refusal of a request for `method` and `path` (never its query string, nor
/// a token), naming the token when it was a known one, and answers it with `error`.
pub(super) fn refused(
    reason: &'static str,
    method: &Method,
    path: &str,
    error: ApiError,
    name: Option<&str>,
) -> Response {
    metrics::counter!(API_REFUSALS, "reason" => reason).increment(1);
    warn!(
        %method,
        path = %path,
        token = name.unwrap_or("-"),
        status = error.status().as_u16(),
        "API request refused: {reason}"
    );
    error.into_response()
}

/// The bearer token of `Authorization`, if the header carries one.
pub(super) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
}

/// The answer to an invalid token from `client`: 401, counted toward the client's
/// invalid-token limit; past it, 429 with `Retry-After` (logged once per run of failures).
pub(super) fn invalid(
    state: &ApiState,
    client: ClientAddr,
    method: &Method,
    path: &str,
    error: ApiError,
) -> Response {
    match state.failures.fail(client) {
        Failed::Counted => refused("invalid", method, path, error, None),
        Failed::Limited { retry_after, first } => {
            metrics::counter!(API_REFUSALS, "reason" => "throttled").increment(1);
            if first {
                warn!(
                    %client,
                    %method,
                    path = %path,
                    "API requests refused: too many invalid tokens from this address; wrong ones are answered 429 until they stop"
                );
            }
            ApiError::too_many(
                format!("too many invalid tokens from this address; retry in {retry_after} s"),
                retry_after,
            )
            .into_response()
        }
    }
}

/// The middleware of a `/v1` route that needs `role`.
pub(super) async fn require(
    State((state, role)): State<(Arc<ApiState>, Role)>,
    mut request: Request,
    next: Next,
) -> Response {
    let presented = bearer(request.headers()).map(|token| token.as_bytes().to_vec());
    let Some(presented) = presented else {
        return refuse(
            "missing",
            &request,
            ApiError::unauthenticated("a bearer token is required (Authorization: Bearer ...)"),
            None,
        );
    };
    let Some(token) = state.tokens.find(&presented) else {
        let client = request
            .extensions()
            .get::<ClientAddr>()
            .copied()
            .unwrap_or(ClientAddr::UNKNOWN);
        return invalid(
            &state,
            client,
            request.method(),
            request.uri().path(),
            ApiError::unauthenticated("the bearer token is not valid"),
        );
    };
    if token.role < role {
        let error = ApiError::forbidden(format!(
            "token `{}` has role {}; this route needs {role}",
            token.name, token.role
        ));
        return refuse("role", &request, error, Some(&token.name));
    }
    // The slot of `max_concurrent`, taken only now: a client without a token takes none.
    let _slot = match state.slot() {
        Ok(slot) => slot,
        Err(busy) => return busy.into_response(),
    };
    request.extensions_mut().insert(Caller {
        name: token.name.clone(),
        role: token.role,
    });
    next.run(request).await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tokens_match_by_digest_and_duplicates_are_refused() {
        let tokens = Tokens(vec![
            Token {
                name: "a".into(),
                role: Role::Reader,
                digest: digest(b"0123456789abcdef-a"),
            },
            Token {
                name: "b".into(),
                role: Role::Operator,
                digest: digest(b"0123456789abcdef-b"),
            },
        ]);
        assert_eq!(tokens.find(b"0123456789abcdef-b").unwrap().name, "b");
        assert_eq!(
            tokens.find(b"0123456789abcdef-a").unwrap().role,
            Role::Reader
        );
        assert!(tokens.find(b"0123456789abcdef-").is_none());
        assert!(tokens.find(b"").is_none());
    }
}
