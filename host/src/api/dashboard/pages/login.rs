//! `/login` and `/logout`: opening a session with an API token, and ending it.

use std::sync::Arc;

use axum::Form;
use axum::extract::rejection::{FormRejection, QueryRejection};
use axum::extract::{FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use serde::Deserialize;
use tracing::{info, warn};

use super::super::session::{self, LoginRefused, Session};
use super::super::view::{self, Nav};
use super::{
    ActionForm, Dashboard, LOGIN_LIMIT, PageError, PageState, Params, action_form, forbidden,
    html_response, same_origin,
};
use crate::api::limits::{ClientAddr, Failed};

/// A login post's head: from this origin, declaring no more than [`LOGIN_LIMIT`] bytes of
/// form. Anyone may post a login, so these are checked before its body is read (which then
/// gets `[api] body_timeout` and [`LOGIN_LIMIT`]). Carries the client's address, whose failed
/// logins are counted.
pub(super) struct LoginHead(ClientAddr);

impl FromRequestParts<Arc<Dashboard>> for LoginHead {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        _: &Arc<Dashboard>,
    ) -> Result<LoginHead, Response> {
        if !same_origin(&parts.headers) {
            return Err((
                StatusCode::FORBIDDEN,
                html_response(login_form(
                    "/",
                    Some("The form was not posted from this dashboard."),
                )),
            )
                .into_response());
        }
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > LOGIN_LIMIT as u64) {
            return Err((
                StatusCode::PAYLOAD_TOO_LARGE,
                [(header::CONNECTION, "close")],
                html_response(login_form("/", Some("The form is too large."))),
            )
                .into_response());
        }
        let client = parts
            .extensions
            .get::<ClientAddr>()
            .copied()
            .unwrap_or(ClientAddr::UNKNOWN);
        Ok(LoginHead(client))
    }
}

/// The session of a logout post: a session, posting from this origin, checked from the head.
pub(super) struct LoggingOut(Session);

impl FromRequestParts<Arc<Dashboard>> for LoggingOut {
    type Rejection = PageError;

    async fn from_request_parts(
        parts: &mut Parts,
        d: &Arc<Dashboard>,
    ) -> Result<LoggingOut, PageError> {
        match d.sessions.get(&parts.headers) {
            Some(session) if same_origin(&parts.headers) => Ok(LoggingOut(session)),
            _ => Err(forbidden("The form's CSRF token is missing or wrong.")),
        }
    }
}

/// A local path to go to after login: `next` when it is one, else `/`. One is a path that
/// starts with exactly one `/` and holds only visible ASCII and no backslash: a browser drops
/// tabs and newlines from a `Location` and reads `\` as `/`, so `/<TAB>/evil.example` or
/// `/\evil.example` would take it to another site.
fn local(next: Option<&str>) -> &str {
    match next {
        Some(n)
            if n.starts_with('/')
                && !n.starts_with("//")
                && n.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') =>
        {
            n
        }
        _ => "/",
    }
}

/// The login page, going to `next` after it, with `error` above the form.
fn login_form(next: &str, error: Option<&str>) -> Markup {
    view::page(
        "Log in",
        Nav::None,
        None,
        html! {
            div.login {
                h1 { "Log in" }
                @if let Some(error) = error { p.notice.error role="alert" { (error) } }
                form method="post" action="/login" {
                    label for="token" { "API token" }
                    input #token type="password" name="token" autocomplete="off" required autofocus;
                    input type="hidden" name="next" value=(next);
                    button type="submit" { "Log in" }
                }
                p.muted { "Use a token from [api] tokens in homing.toml. A reader sees everything; an operator can also cancel, retry and interrupt." }
            }
        },
    )
}

/// `GET /login`.
pub(super) async fn page(
    State(d): PageState,
    headers: HeaderMap,
    query: Result<Query<Params>, QueryRejection>,
) -> Response {
    let next = query.ok().and_then(|Query(p)| p.next);
    let next = local(next.as_deref());
    if d.sessions.get(&headers).is_some() {
        return Redirect::to(next).into_response();
    }
    html_response(login_form(next, None))
}

#[derive(Debug, Deserialize)]
pub(super) struct LoginForm {
    #[serde(default)]
    token: String,
    next: Option<String>,
}

/// `POST /login`. A right token always logs in; a wrong one is 401, or 429 once its client
/// address has failed too often (with the API's invalid tokens; `limits::Failures`).
pub(super) async fn login(
    State(d): PageState,
    LoginHead(client): LoginHead,
    form: Result<Form<LoginForm>, FormRejection>,
) -> Response {
    let Ok(Form(form)) = form else {
        return (
            StatusCode::BAD_REQUEST,
            html_response(login_form("/", Some("The form could not be read."))),
        )
            .into_response();
    };
    let next = local(form.next.as_deref());
    let Some((name, role)) = d.api.tokens.identify(form.token.trim().as_bytes()) else {
        if let Failed::Limited { retry_after, first } = d.api.failures.fail(client) {
            if first {
                warn!(%client, "dashboard logins refused: too many invalid tokens from this address; wrong ones are answered 429 until they stop");
            }
            let page = login_form(
                next,
                Some("Too many failed logins from this address; wait a minute."),
            );
            return (
                StatusCode::TOO_MANY_REQUESTS,
                [(header::RETRY_AFTER, retry_after.to_string())],
                html_response(page),
            )
                .into_response();
        }
        let message = "That token is not valid.";
        warn!(%client, "dashboard login refused: {message}");
        return (
            StatusCode::UNAUTHORIZED,
            html_response(login_form(next, Some(message))),
        )
            .into_response();
    };
    match d.sessions.login(name.clone(), role) {
        Ok(id) => {
            info!(token = %name, "dashboard login");
            (
                StatusCode::SEE_OTHER,
                [
                    (header::LOCATION, next.to_owned()),
                    (header::SET_COOKIE, session::set_cookie(&id)),
                ],
            )
                .into_response()
        }
        Err(refused) => {
            let (code, message) = match refused {
                LoginRefused::Full | LoginRefused::NoRandom => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "No session can be opened just now; try again later.",
                ),
            };
            warn!(status = code.as_u16(), "dashboard login refused: {message}");
            (code, html_response(login_form(next, Some(message)))).into_response()
        }
    }
}

/// `POST /logout`.
pub(super) async fn logout(
    State(d): PageState,
    headers: HeaderMap,
    LoggingOut(current): LoggingOut,
    form: Result<Form<ActionForm>, FormRejection>,
) -> Response {
    if !current.csrf_ok(&action_form(form).csrf) {
        return forbidden("The form's CSRF token is missing or wrong.").into_response();
    }
    d.sessions.logout(&headers);
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, "/login".to_owned()),
            (header::SET_COOKIE, session::clear_cookie()),
        ],
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_local_paths_are_followed_after_login() {
        assert_eq!(local(Some("/dispatches?agent=a")), "/dispatches?agent=a");
        for bad in [
            "//evil.example/",
            "https://evil.example/",
            "/\\evil",
            "",
            "/\t/evil.example",
            "/\n/evil.example",
            "/\r\n/evil.example",
            "/ /evil.example",
            "/\u{7f}/evil.example",
            "/caf\u{e9}",
            "\\/evil.example",
        ] {
            assert_eq!(local(Some(bad)), "/", "{bad}");
        }
        assert_eq!(local(None), "/");
    }
}
