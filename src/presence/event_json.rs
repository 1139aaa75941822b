//! An event's data as JSON: what `/v1/events` carries after `data:` and what a webhook
//! delivery carries beside the event's `id` and `type`, written by one function so the two
//! never differ.

use std::fmt::Write;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use serde_json::Value;

use crate::presence::{Claims, Event, Origin, What};
use crate::proto::Device;

/// Appends `event`'s data object to `out`. `node` is this node's id, already JSON-quoted:
/// an `online` of this node names it.
pub fn write_data(out: &mut String, event: &Event, node: &str) {
    let Event { uid, what, at_ms, .. } = event;
    let device = |d: &Device| Value::String(d.as_str().into());
    let _ = match what {
        What::Online { session, device: d, node: at, claims, origin, superseded, timeout_ms } => {
            let at = at.as_ref().map_or_else(|| node.to_string(), |at| Value::String(at.to_string()).to_string());
            let d = device(d);
            let _ = write!(out, r#"{{"uid":{uid},"session":"{session:016x}","device":{d},"node":{at}"#);
            if *timeout_ms > 0 {
                let _ = write!(out, r#","timeout_ms":{timeout_ms}"#);
            }
            write_origin(out, origin);
            write_claims(out, claims.as_deref());
            if *superseded {
                out.push_str(r#","superseded":true"#);
            }
            write!(out, r#","at_ms":{at_ms}}}"#)
        }
        What::Offline { session, device: d, reason, will, claims } => {
            let d = device(d);
            let _ = write!(out, r#"{{"uid":{uid},"session":"{session:016x}","device":{d},"reason":"{reason}""#);
            write_claims(out, claims.as_deref());
            if let Some(will) = will {
                let topic = Value::from(will.topic.as_ref());
                let _ = write!(out, r#","will":{{"topic":{topic},"payload":""#);
                BASE64.encode_string(&will.payload, out);
                out.push_str("\"}");
            }
            write!(out, r#","at_ms":{at_ms}}}"#)
        }
        What::UserOnline => write!(out, r#"{{"uid":{uid},"at_ms":{at_ms}}}"#),
        What::UserOffline { reason, ended_ms } => {
            write!(out, r#"{{"uid":{uid},"reason":"{reason}","ended_ms":{ended_ms},"at_ms":{at_ms}}}"#)
        }
        What::Status { status } => {
            // Any UTF-8 a client chose: escaped as JSON.
            write!(out, r#"{{"uid":{uid},"status":{},"at_ms":{at_ms}}}"#, Value::from(status.as_ref()))
        }
        What::Data { payload, topic } => {
            let _ = write!(out, r#"{{"uid":{uid},"payload":""#);
            BASE64.encode_string(payload, out);
            out.push('"');
            if let Some(topic) = topic {
                // Any UTF-8 a client chose: escaped as JSON.
                let _ = write!(out, r#","topic":{}"#, Value::from(topic.as_ref()));
            }
            write!(out, r#","at_ms":{at_ms}}}"#)
        }
    };
}

/// `,"door":"tcp","remote":"ip:port"`, each where known.
pub(crate) fn write_origin(out: &mut String, origin: &Origin) {
    if let Some(door) = origin.door {
        let _ = write!(out, r#","door":"{door}""#);
    }
    if let Some(remote) = origin.remote {
        let _ = write!(out, r#","remote":"{remote}""#);
    }
}

/// `,"claims":{...}` when the session's token gave any (a JSON object already).
fn write_claims(out: &mut String, claims: Option<&Claims>) {
    if let Some(claims) = claims {
        out.push_str(r#","claims":"#);
        out.push_str(claims.as_json());
    }
}
