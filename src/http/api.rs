//! The backend API: presence, push, kicks, the event stream and the watch lists, as JSON
//! over HTTP.
//!
//! Every handler returns `Result<_, ApiError>`, and every error is the same JSON shape,
//! `{"error": "..."}`, naming the field or limit at fault (as axum's error-handling example
//! does). The answers come from the gateway's [`crate::presence::Directory`], so the same
//! routes serve one process or a cluster.
//!
//! `GET /v1/events` is Server-Sent Events: each consumer follows the event log from its own
//! position, in batches written as one chunk each, so a consumer that reads slowly holds no
//! more than the chunk it is being sent (about 1 MiB at most), and all consumers together
//! at most [`EVENT_STREAMS_BYTES`]: past it, consumers wait their turn.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use futures_util::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::config::WatchPolicy;
use crate::http::listener::{Bounded, API_CONNECTIONS, HTTP_IDLE};
use crate::http::state::{State as Shared, EVENT_STREAMS_BYTES};
use crate::presence::{
    session_hex, write_event_data, Batch, DirectoryError, Event, EventId, ListError, Located, NodeCount, Push, What,
};
use crate::proto::mqtt::check_topic_name;
use crate::proto::{Device, EventKind};

/// Largest request body: 10,000 uids and a 64 KiB payload in base64 fit with room to spare.
const MAX_BODY_BYTES: usize = 4 * 1024 * 1024;

/// Most uids one presence query or push may name: a backend batches, and one request never
/// holds the directory for long.
const MAX_UIDS: usize = 10_000;

/// An idle event stream sends a comment this often, so proxies and load balancers do not
/// close it as dead.
const SSE_KEEPALIVE: Duration = Duration::from_secs(15);

/// An API error: a status and a message for the `error` field.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

// === impl ApiError ===

impl ApiError {
    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into() }
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::NOT_FOUND, message: message.into() }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

impl From<DirectoryError> for ApiError {
    fn from(e: DirectoryError) -> ApiError {
        let status = match e {
            DirectoryError::BadCursor(_) => StatusCode::BAD_REQUEST,
            DirectoryError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        ApiError { status, message: e.to_string() }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> ApiError {
        let message = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            format!("request body over the limit of {MAX_BODY_BYTES} bytes")
        } else {
            e.body_text()
        };
        ApiError { status: e.status(), message }
    }
}

/// Serves the backend API on `listener` until `stop` is cancelled; open event streams end
/// then too.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let config = &shared.settings;
    let listener = Bounded::new(listener, API_CONNECTIONS, HTTP_IDLE).with_tls(config.tls.as_ref(), config.api_tls);
    let app = router(shared, stop.clone());
    if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await {
        tracing::error!(error = %e, "backend API failed");
    }
}

/// Uids on a page of `GET /v1/online/uids` unless the request says: a few KiB of JSON.
const DEFAULT_UID_PAGE: usize = 1_000;

/// Most uids on a page: about 200 KiB of JSON, a bounded answer however many are online.
const MAX_UID_PAGE: usize = 10_000;

#[derive(Clone)]
struct ApiState {
    shared: Arc<Shared>,
    stop: CancellationToken,
}

/// Every route with the status it answers when all goes well, and the two catch-alls: their
/// request counters exist at 0 from the start, so a dashboard's `rate()` shows 0, not "no
/// data", on a gateway whose API has not been called yet.
const COUNTED: [(&str, u16); 11] = [
    ("/v1/presence/{uid}", 200),
    ("/v1/presence/query", 200),
    ("/v1/online", 200),
    ("/v1/online/uids", 200),
    ("/v1/push", 200),
    ("/v1/sessions/{uid}", 204),
    ("/v1/events", 200),
    ("/v1/watchlists/{uid}", 200),
    ("/v1/openapi.json", 200),
    ("unauthorized", 401),
    ("unmatched", 404),
];

fn router(shared: Arc<Shared>, stop: CancellationToken) -> Router {
    for (route, code) in COUNTED {
        shared.metrics.api_request_series(route, code);
    }
    let state = ApiState { shared, stop };
    Router::new()
        .route("/v1/presence/{uid}", get(presence))
        .route("/v1/presence/query", post(presence_query))
        .route("/v1/online", get(online))
        .route("/v1/online/uids", get(online_uids))
        .route("/v1/push", post(push))
        .route("/v1/sessions/{uid}", delete(kick))
        .route("/v1/events", get(events))
        .route("/v1/watchlists/{uid}", get(get_watchlist).put(put_watchlist).delete(delete_watchlist))
        .route("/v1/openapi.json", get(openapi))
        .route_layer(middleware::from_fn_with_state(state.clone(), count_request))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(middleware::from_fn_with_state(state.clone(), require_token))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// `/v1/events` alone, with the API's token check and request counting: the status page on
/// the admin listener follows events through it.
pub(crate) fn events_router(shared: Arc<Shared>, stop: CancellationToken) -> Router {
    let state = ApiState { shared, stop };
    Router::new()
        .route("/v1/events", get(events))
        .route_layer(middleware::from_fn_with_state(state.clone(), count_request))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state)
}

/// This API described in OpenAPI 3.1 (docs/openapi.json); `tests/openapi.rs` holds the
/// running API to it.
const OPENAPI: &str = include_str!("../../docs/openapi.json");

/// `GET /v1/openapi.json`.
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Refuses requests without the `--api-token` bearer token, comparing in constant time.
async fn require_token(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    if let Some(token) = &state.shared.settings.api_token {
        let given =
            request.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer).unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            state.shared.metrics.api_request("unauthorized", 401);
            let error = ApiError {
                status: StatusCode::UNAUTHORIZED,
                message: "missing or wrong bearer token (Authorization: Bearer <--api-token>)".into(),
            };
            return ([(header::WWW_AUTHENTICATE, "Bearer")], error).into_response();
        }
    }
    next.run(request).await
}

/// The credentials of a `Bearer` authorization; the scheme is case-insensitive (RFC 9110).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| credentials.trim_start())
}

/// Counts every routed request by its route pattern and status, and times it.
async fn count_request(State(state): State<ApiState>, path: MatchedPath, request: Request, next: Next) -> Response {
    let started = tokio::time::Instant::now();
    let response = next.run(request).await;
    let metrics = &state.shared.metrics;
    metrics.api_latency(path.as_str(), started.elapsed().as_secs_f64());
    metrics.api_request(path.as_str(), response.status().as_u16());
    response
}

async fn no_route(State(state): State<ApiState>, request: Request) -> ApiError {
    state.shared.metrics.api_request("unmatched", 404);
    ApiError::not_found(format!("no route {} {}", request.method(), request.uri().path()))
}

async fn wrong_method(State(state): State<ApiState>, request: Request) -> ApiError {
    state.shared.metrics.api_request("unmatched", 405);
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        message: format!("{} is not allowed on {}", request.method(), request.uri().path()),
    }
}

/// `GET /v1/presence/{uid}`: every session of the uid, and at the top level the most
/// recently active one's `node`, `since_ms` and `silent_ms` (what a backend written before
/// devices reads).
async fn presence(State(state): State<ApiState>, Path(uid): Path<String>) -> Result<Json<Value>, ApiError> {
    let uid = parse_uid("uid", &uid)?;
    let sessions = state.shared.directory.locate(uid).await?;
    // The most recently active: the least silent, a session of unknown silence last.
    let Some(recent) = sessions.iter().min_by_key(|s| s.silent_ms.unwrap_or(u64::MAX)) else {
        // No session; still online as a user while its offline grace lasts.
        return Ok(Json(match state.shared.directory.grace_until(uid).await? {
            Some(until) => json!({ "uid": uid, "online": true, "sessions": [], "grace_until_ms": until }),
            None => match state.shared.directory.last_seen(uid).await? {
                Some(seen) => json!({ "uid": uid, "online": false, "sessions": [], "last_seen_ms": seen }),
                None => json!({ "uid": uid, "online": false, "sessions": [] }),
            },
        }));
    };
    let mut answer = json!({ "uid": uid, "online": true, "node": recent.node, "since_ms": recent.since_ms });
    if let Some(silent_ms) = recent.silent_ms {
        answer["silent_ms"] = silent_ms.into();
    }
    let session = |s: &Located| {
        let mut one = json!({
            "device": s.device.as_str(),
            "session": session_hex(s.session),
            "node": s.node,
            "since_ms": s.since_ms,
        });
        if let Some(silent_ms) = s.silent_ms {
            one["silent_ms"] = silent_ms.into();
        }
        if let Some(timeout_ms) = s.timeout_ms {
            one["timeout_ms"] = timeout_ms.into();
        }
        if let Some(door) = s.origin.door {
            one["door"] = door.label().into();
        }
        if let Some(remote) = s.origin.remote {
            one["remote"] = remote.to_string().into();
        }
        if let Some(claims) = s.claims.as_deref().and_then(|c| serde_json::from_str::<Value>(c.as_json()).ok()) {
            one["claims"] = claims;
        }
        one
    };
    answer["sessions"] = sessions.iter().map(session).collect();
    Ok(Json(answer))
}

/// `POST /v1/presence/query` with `{"uids": [...]}`.
async fn presence_query(
    State(state): State<ApiState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = json_body(&body?)?;
    let (uids, form) = uid_list(&body)?;
    let online = state.shared.directory.query(&uids).await?;
    let (on, off) = split_by(uids, online);
    // When each offline uid was last online, for those remembered (`--last-seen-capacity`,
    // `--last-seen-ttl`), keyed by the uid in decimal.
    let seen = state.shared.directory.last_seen_of(&off).await?;
    let last_seen: serde_json::Map<String, Value> =
        off.iter().zip(seen).filter_map(|(uid, at)| Some((uid.to_string(), Value::from(at?)))).collect();
    Ok(Json(json!({ "online": form.render(on), "offline": form.render(off), "last_seen_ms": last_seen })))
}

/// `GET /v1/online/uids?cursor=<opaque>&limit=<n>`: one page of the uids online (their
/// offline grace included), at most `limit` (1 to 10,000; 1,000 by default), and the next
/// page's cursor (null after the last). Every uid online during the whole scan is on some
/// page; `as_of` (the same on every page) is the newest event when the scan began, and a
/// backend that applies the stream's user events after it to the scan's uids has the exact
/// picture (docs/API.md, "Catching up after a gap").
async fn online_uids(State(state): State<ApiState>, RawQuery(query): RawQuery) -> Result<Json<Value>, ApiError> {
    let (mut cursor, mut limit) = (None, DEFAULT_UID_PAGE);
    for (key, value) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match &*key {
            "cursor" => cursor = Some(value.into_owned()),
            "limit" => {
                limit =
                    value.parse().ok().filter(|n| (1..=MAX_UID_PAGE).contains(n)).ok_or_else(|| {
                        ApiError::bad_request(format!("limit: a whole number from 1 to {MAX_UID_PAGE}"))
                    })?
            }
            other => return Err(ApiError::bad_request(format!("{other}: not a parameter of this route"))),
        }
    }
    let page = state.shared.directory.online_uids(cursor.as_deref(), limit).await?;
    Ok(Json(json!({ "uids": page.uids, "cursor": page.cursor, "as_of": page.as_of.to_string() })))
}

/// `GET /v1/online`: the cluster's totals (this node's alone when it runs alone), this
/// node's own figures, and each node's.
async fn online(State(state): State<ApiState>) -> Result<Json<Value>, ApiError> {
    let count = state.shared.directory.online().await?;
    let node = |n: &NodeCount| json!({ "node": n.node, "online": n.online, "connections": n.connections });
    Ok(Json(json!({
        "online": count.online,
        "connections": count.connections,
        "local": node(&count.local),
        "nodes": count.nodes.iter().map(node).collect::<Vec<_>>(),
    })))
}

/// `POST /v1/push` with `{"uids": [...], "payload": "<base64>"}` and optionally
/// `"device": "<name>"` and `"topic": "<MQTT topic name>"`: one PUSH to every session of
/// each listed uid, or to its session on that device; an MQTT session takes it only when
/// one of its subscriptions matches the topic (by default `--mqtt-push-topic`).
async fn push(State(state): State<ApiState>, body: Result<Bytes, BytesRejection>) -> Result<Json<Value>, ApiError> {
    let body = json_body(&body?)?;
    let (mut uids, form) = uid_list(&body)?;
    // One PUSH per uid, however often it is listed.
    let mut seen = std::collections::HashSet::with_capacity(uids.len());
    uids.retain(|uid| seen.insert(*uid));
    let payload = match body.get("payload") {
        Some(Value::String(text)) => {
            BASE64.decode(text).map_err(|e| ApiError::bad_request(format!("payload: not standard base64: {e}")))?
        }
        Some(_) => return Err(ApiError::bad_request("payload: must be a base64 string")),
        None => return Err(ApiError::bad_request("payload: missing")),
    };
    let limit = state.shared.settings.max_push_bytes;
    if payload.len() > limit {
        return Err(ApiError::bad_request(format!(
            "payload: {} bytes decoded, over the limit of {limit} (--max-frame-bytes - 1)",
            payload.len()
        )));
    }
    let device = match body.get("device") {
        Some(Value::String(name)) => Some(parse_device("device", name)?),
        Some(_) => return Err(ApiError::bad_request("device: must be a string")),
        None => None,
    };
    let topic = match body.get("topic") {
        Some(Value::String(name)) => {
            check_topic_name(name).map_err(|e| ApiError::bad_request(format!("topic: {e}")))?;
            Arc::from(name.as_str())
        }
        Some(_) => return Err(ApiError::bad_request("topic: must be a string")),
        None => state.shared.settings.push_topic.clone(),
    };
    let push = Push { topic, payload: Bytes::from(payload) };
    let reached = state.shared.directory.push(&uids, device, push).await?;
    let sessions: usize = reached.iter().map(|r| r.sessions).sum();
    // A uid online only on MQTT sessions that did not subscribe to the topic was not
    // reached, and is not offline either: it is listed as unsubscribed.
    let (mut sent, mut offline, mut unsubscribed) = (Vec::new(), Vec::new(), Vec::new());
    for (uid, reach) in uids.into_iter().zip(&reached) {
        match (reach.sessions, reach.unsubscribed) {
            (0, 0) => offline.push(uid),
            (0, _) => unsubscribed.push(uid),
            _ => sent.push(uid),
        }
    }
    let metrics = &state.shared.metrics;
    metrics.pushes_sent.inc_by(sent.len() as u64);
    metrics.pushes_offline.inc_by(offline.len() as u64);
    metrics.pushes_unsubscribed.inc_by(unsubscribed.len() as u64);
    Ok(Json(json!({
        "sent": form.render(sent),
        "offline": form.render(offline),
        "unsubscribed": form.render(unsubscribed),
        "sessions": sessions,
    })))
}

/// `DELETE /v1/sessions/{uid}`: BYE(kicked) to every session of the uid, or with
/// `?device=<name>` to its session on that device.
async fn kick(
    State(state): State<ApiState>,
    Path(uid): Path<String>,
    uri: axum::http::Uri,
) -> Result<StatusCode, ApiError> {
    let uid = parse_uid("uid", &uid)?;
    let mut device = None;
    for (key, value) in form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()) {
        match &*key {
            "device" => device = Some(parse_device("device", &value)?),
            _ => return Err(ApiError::bad_request(format!("{key}: unknown parameter; expected device"))),
        }
    }
    match (state.shared.directory.kick(uid, device.clone()).await?, device) {
        (0, None) => Err(ApiError::not_found(format!("uid {uid} is offline"))),
        (0, Some(device)) => Err(ApiError::not_found(format!("uid {uid} has no session on device {device:?}"))),
        _ => Ok(StatusCode::NO_CONTENT),
    }
}

/// `PUT /v1/watchlists/{uid}` with `{"uids": [...]}`: whom `uid`'s sessions may watch under
/// `--watch-policy listed`, replacing the list it had. Its sessions that watch a uid the new
/// list leaves out (and their tokens' claims do not list) stop watching it, and are told it
/// as a uid that never logged in. Answers the list as kept: sorted, without repeats.
async fn put_watchlist(
    State(state): State<ApiState>,
    Path(uid): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let uid = parse_uid("uid", &uid)?;
    let body = json_body(&body?)?;
    let (uids, form) = uid_list(&body)?;
    let shared = &state.shared;
    let list = shared.watch_lists.store().put(uid, uids).await.map_err(list_error)?;
    revoke_unlisted(shared, uid);
    Ok(Json(json!({ "uid": uid, "uids": form.render(list.to_vec()) })))
}

/// `GET /v1/watchlists/{uid}`: the list its backend put, or 404.
async fn get_watchlist(State(state): State<ApiState>, Path(uid): Path<String>) -> Result<Json<Value>, ApiError> {
    let uid = parse_uid("uid", &uid)?;
    match state.shared.watch_lists.store().get(uid).await.map_err(list_error)? {
        Some(list) => Ok(Json(json!({ "uid": uid, "uids": list.to_vec() }))),
        None => Err(ApiError::not_found(format!("uid {uid} has no watch list"))),
    }
}

/// `DELETE /v1/watchlists/{uid}`: drops the list (its sessions stop watching what only it
/// allowed), or 404.
async fn delete_watchlist(State(state): State<ApiState>, Path(uid): Path<String>) -> Result<StatusCode, ApiError> {
    let uid = parse_uid("uid", &uid)?;
    let shared = &state.shared;
    if !shared.watch_lists.store().delete(uid).await.map_err(list_error)? {
        return Err(ApiError::not_found(format!("uid {uid} has no watch list")));
    }
    revoke_unlisted(shared, uid);
    Ok(StatusCode::NO_CONTENT)
}

/// `uid`'s sessions here stop watching what the lists no longer allow, under `listed`
/// (under `open` anyone may watch anyone, and under `none` nobody watches); in a cluster the
/// store has told the other nodes. The gauge of listed uids follows, where this process
/// holds the lists.
fn revoke_unlisted(shared: &Arc<Shared>, uid: u64) {
    if let Some(entries) = shared.watch_lists.store().entries() {
        shared.metrics.watchlist_entries.set(entries as i64);
    }
    if shared.settings.watch_policy == WatchPolicy::Listed {
        shared.watches.revoke(uid);
    }
}

/// A list refused (400 too long, 507 this node's bound) or out of reach (503).
fn list_error(e: ListError) -> ApiError {
    match e {
        ListError::TooLong { .. } => ApiError::bad_request(format!("uids: {e}")),
        ListError::NodeFull { .. } => ApiError { status: StatusCode::INSUFFICIENT_STORAGE, message: e.to_string() },
        ListError::Unavailable(_) => ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: e.to_string() },
    }
}

/// Which event types a consumer wants, by [`EventKind::index`].
#[derive(Debug, Clone, Copy)]
struct Types([bool; EventKind::ALL.len()]);

// === impl Types ===

impl Types {
    fn parse(list: &str) -> Result<Types, ApiError> {
        let mut wanted = [false; EventKind::ALL.len()];
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let kind: EventKind = word.parse().map_err(|e| ApiError::bad_request(format!("types: {e}")))?;
            wanted[kind.index()] = true;
        }
        Ok(Types(wanted))
    }

    fn wants(&self, what: &What) -> bool {
        self.0[what.kind().index()]
    }
}

/// `GET /v1/events`: Server-Sent Events, resumable with `Last-Event-ID` or `?after=`.
async fn events(State(state): State<ApiState>, headers: HeaderMap, request: Request) -> Result<Response, ApiError> {
    let mut after = None;
    let mut tail = None;
    let mut types = Types([true; EventKind::ALL.len()]);
    for (key, value) in form_urlencoded::parse(request.uri().query().unwrap_or("").as_bytes()) {
        match &*key {
            "after" => after = Some(parse_event_id("after", &value)?),
            "tail" => tail = Some(parse_tail(&value)?),
            "types" => types = Types::parse(&value)?,
            _ => return Err(ApiError::bad_request(format!("{key}: unknown parameter; expected after, tail, types"))),
        }
    }
    if after.is_none() {
        if let Some(last) = headers.get("last-event-id") {
            let last = last.to_str().map_err(|_| ApiError::bad_request("Last-Event-ID: not text"))?;
            after = Some(parse_event_id("Last-Event-ID", last)?);
        }
    }
    if after.is_none() {
        // "From now" is the newest event when the request is answered, fixed before the
        // response head goes out: a consumer that saw the head misses nothing logged after.
        after = Some(state.shared.directory.recent(tail.unwrap_or(0)).await?);
    }
    let node = state.shared.settings.node_id.clone();
    let batches = state.shared.directory.follow(after);
    let budget = state.shared.stream_budget.clone();
    let body = sse_body(batches, types, node, budget).take_until(state.stop.cancelled_owned());
    let headers = [
        (header::CONTENT_TYPE, "text/event-stream"),
        (header::CACHE_CONTROL, "no-cache"),
        (header::HeaderName::from_static("x-accel-buffering"), "no"),
    ];
    Ok((headers, Body::from_stream(body)).into_response())
}

/// Each batch as one chunk of SSE text; a comment when nothing happened for a while.
///
/// A chunk holds its size in permits of `budget` until the connection has written it and
/// dropped it; the next batch is not even read before its permits are free. So a consumer
/// holds at most one chunk (about 1 MiB, see [`crate::presence::READ_BATCH_BYTES`]), and
/// all consumers together at most the budget.
fn sse_body(
    batches: BoxStream<'static, Batch>,
    types: Types,
    node: String,
    budget: Arc<Semaphore>,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let node = Value::String(node).to_string();
    stream::unfold((batches, node), move |(mut batches, node)| {
        let budget = budget.clone();
        async move {
            loop {
                match tokio::time::timeout(SSE_KEEPALIVE, batches.next()).await {
                    Err(_) => return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), (batches, node))),
                    Ok(None) => return None,
                    Ok(Some(batch)) => {
                        let chunk = format_batch(&batch, types, &node);
                        if chunk.is_empty() {
                            continue;
                        }
                        let want = u32::try_from(chunk.len().min(EVENT_STREAMS_BYTES)).unwrap_or(u32::MAX);
                        let Ok(permit) = budget.acquire_many_owned(want).await else { return None };
                        return Some((Ok(Bytes::from_owner(Held { chunk, _permit: permit })), (batches, node)));
                    }
                }
            }
        }
    })
}

/// A chunk on its way to a consumer, with its share of the budget.
struct Held {
    chunk: String,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        self.chunk.as_bytes()
    }
}

/// SSE text of a batch: a `gap` first if the consumer missed events, then every event of a
/// wanted type. `node` is the node id already JSON-quoted.
fn format_batch(batch: &Batch, types: Types, node: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(batch.events.len() * 128);
    if batch.has_gap() {
        let _ = write!(out, "id: {}\nevent: gap\ndata: {{\"missed\":{}", batch.gap_id, batch.missed_json());
        if batch.earlier_process {
            out.push_str(",\"earlier_process\":true");
        }
        if batch.earlier_stream {
            out.push_str(",\"earlier_stream\":true");
        }
        out.push_str("}\n\n");
    }
    for event in batch.events.iter().filter(|e| types.wants(&e.what)) {
        format_event(&mut out, event, node);
    }
    out
}

fn format_event(out: &mut String, event: &Event, node: &str) {
    use std::fmt::Write;
    let _ = write!(out, "id: {}\nevent: {}\ndata: ", event.id, event.what.name());
    write_event_data(out, event, node);
    out.push_str("\n\n");
}

/// Splits `uids` by `flags`, in order: those flagged, then the others.
fn split_by(uids: Vec<u64>, flags: Vec<bool>) -> (Vec<u64>, Vec<u64>) {
    let (yes, no): (Vec<_>, Vec<_>) = uids.into_iter().zip(flags).partition(|&(_, flag)| flag);
    (yes.into_iter().map(|(uid, _)| uid).collect(), no.into_iter().map(|(uid, _)| uid).collect())
}

fn json_body(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("body: not valid JSON: {e}")))
}

/// How a request spelled its uids, so the answer spells them the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UidForm {
    Numbers,
    /// Decimal strings: JavaScript's numbers lose precision above 2^53, so a client there
    /// sends (and gets back) uids as strings.
    Strings,
}

impl UidForm {
    fn render(self, uids: Vec<u64>) -> Value {
        match self {
            UidForm::Numbers => json!(uids),
            UidForm::Strings => json!(uids.iter().map(u64::to_string).collect::<Vec<_>>()),
        }
    }
}

/// The `uids` field: an array of at most [`MAX_UIDS`] unsigned 64-bit integers, as numbers
/// or as decimal strings (any string makes the answer use strings).
fn uid_list(body: &Value) -> Result<(Vec<u64>, UidForm), ApiError> {
    let list = match body.get("uids") {
        Some(Value::Array(list)) => list,
        Some(_) => return Err(ApiError::bad_request("uids: must be an array of unsigned 64-bit integers")),
        None => return Err(ApiError::bad_request("uids: missing")),
    };
    if list.len() > MAX_UIDS {
        return Err(ApiError::bad_request(format!("uids: {} listed, over the limit of {MAX_UIDS}", list.len())));
    }
    let form = if list.iter().any(Value::is_string) { UidForm::Strings } else { UidForm::Numbers };
    let uids = list
        .iter()
        .enumerate()
        .map(|(i, v)| match v {
            Value::String(text) => parse_uid(&format!("uids[{i}]"), text),
            _ => v.as_u64().ok_or_else(|| ApiError::bad_request(format!("uids[{i}]: {v} is not a u64"))),
        })
        .collect::<Result<_, _>>()?;
    Ok((uids, form))
}

/// A device name as the API takes it: the empty string is the default device.
fn parse_device(field: &str, text: &str) -> Result<Device, ApiError> {
    text.parse().map_err(|e: crate::proto::DeviceError| ApiError::bad_request(format!("{field}: {e}")))
}

fn parse_uid(field: &str, text: &str) -> Result<u64, ApiError> {
    text.parse().map_err(|_| ApiError::bad_request(format!("{field}: {text:?} is not an unsigned 64-bit integer")))
}

/// Most events `?tail=` may ask for: what a page shows, not a way around resuming by id.
const MAX_TAIL: usize = 1000;

fn parse_tail(text: &str) -> Result<usize, ApiError> {
    match text.parse::<usize>() {
        Ok(n) if n <= MAX_TAIL => Ok(n),
        _ => Err(ApiError::bad_request(format!("tail: {text:?} is not a number of events from 0 to {MAX_TAIL}"))),
    }
}

fn parse_event_id(field: &str, text: &str) -> Result<EventId, ApiError> {
    text.parse().map_err(|()| ApiError::bad_request(format!("{field}: {text:?} is not an event id")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_names_every_route_and_this_version() {
        let doc: Value = serde_json::from_str(OPENAPI).expect("docs/openapi.json is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"), "docs/openapi.json's info.version");
        let mut documented: Vec<&str> = doc["paths"].as_object().unwrap().keys().map(String::as_str).collect();
        let mut routed: Vec<&str> = COUNTED.iter().map(|(route, _)| *route).filter(|r| r.starts_with('/')).collect();
        documented.sort_unstable();
        routed.sort_unstable();
        assert_eq!(documented, routed, "docs/openapi.json's paths and the API's routes");
    }
}
