//! The OpenAPI 3.1 document the gateway serves at `/v1/openapi.json` (docs/openapi.json)
//! held to the running API: every documented operation is called, on its happy path and on
//! its errors, and every answer must be a status the document lists, with a body its schema
//! (checked by the `jsonschema` crate, JSON Schema 2020-12 as OpenAPI 3.1 uses) accepts.
//! The events `/v1/events` streams are checked against the schema the document names for
//! their type. The other direction, that every route is documented, is a unit test of the
//! router (`http/api.rs`).

mod common;

use std::collections::BTreeSet;

use common::{http, Client, Sse, TestServer, PATIENCE};
use idlegate::Config;
use idlegate_proto::Frame;
use serde_json::{json, Value};

const TOKEN: &str = "openapi-test-token";

/// The document, and the operations answered so far as `(path, method, status)`.
struct Checker {
    doc: Value,
    seen: BTreeSet<(String, String, String)>,
}

impl Checker {
    /// `schema` (any schema of the document, or a `$ref` into it) checks `instance`.
    fn check(&self, schema: &Value, instance: &Value, what: &str) {
        let root = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "components": self.doc["components"],
            "allOf": [schema],
        });
        if let Err(e) = jsonschema::validate(&root, instance) {
            panic!("{what}: {instance} does not match its schema: {e}");
        }
    }

    /// Calls `method path` and holds its answer to the document's operation `template`.
    async fn call(
        &mut self,
        server: &TestServer,
        method: &str,
        template: &str,
        path: &str,
        body: &str,
        token: bool,
    ) -> (u16, Value) {
        let auth = format!("Authorization: Bearer {TOKEN}");
        let headers: Vec<&str> = if token { vec![auth.as_str()] } else { vec![] };
        let (status, text) = http(server.api, method, path, &headers, body).await;
        let operation = &self.doc["paths"][template][method.to_lowercase()];
        assert!(operation.is_object(), "{method} {template} is not documented");
        let response = &operation["responses"][status.to_string()];
        assert!(response.is_object(), "{method} {path} answered {status}, which the document does not list: {text}");
        let body: Value =
            if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap_or(Value::Null) };
        match response["content"]["application/json"].get("schema") {
            Some(schema) => self.check(schema, &body, &format!("{method} {path} {status}")),
            None => assert!(text.is_empty(), "{method} {path} {status} has a body the document does not give: {text}"),
        }
        self.seen.insert((template.to_string(), method.to_lowercase(), status.to_string()));
        (status, body)
    }
}

#[tokio::test]
async fn every_documented_operation_answers_as_documented() {
    // Room for 3 listed uids on the node: a fourth is refused (507).
    let watch = idlegate::WatchConfig { max_watch: 3, max_entries: 3, ..idlegate::WatchConfig::default() };
    let config = Config { api_token: Some(TOKEN.into()), watch, ..common::short_config() };
    let mut server = TestServer::start(config).await;
    let auth = format!("Authorization: Bearer {TOKEN}");
    let (status, text) = http(server.api, "GET", "/v1/openapi.json", &[&auth], "").await;
    assert_eq!(status, 200, "{text}");
    let doc: Value = serde_json::from_str(&text).expect("the document is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let mut checker = Checker { doc, seen: BTreeSet::new() };
    let (status, mut events) = Sse::open(server.api, "/v1/events", &[&auth]).await;
    assert_eq!(status, 200);
    checker.seen.insert(("/v1/events".into(), "get".into(), "200".into()));

    let mut phone = Client::connect(server.addr).await;
    assert_eq!(phone.login_device(42, "phone").await.len(), 16);
    phone.send(Frame::Data(bytes::Bytes::from_static(b"up"))).await;
    phone.send(Frame::Status("away".into())).await;
    let p = "/v1/presence/{uid}";
    // Eventually online (the log is read by the API as it is written).
    checker.call(&server, "GET", p, "/v1/presence/42", "", true).await;
    checker.call(&server, "GET", p, "/v1/presence/43", "", true).await;
    checker.call(&server, "GET", p, "/v1/presence/nobody", "", true).await;
    checker.call(&server, "GET", p, "/v1/presence/42", "", false).await;

    let q = "/v1/presence/query";
    let (_, answer) = checker.call(&server, "POST", q, q, r#"{"uids":[42,"43"]}"#, true).await;
    assert_eq!(answer, json!({"online": ["42"], "offline": ["43"], "last_seen_ms": {}}));
    checker.call(&server, "POST", q, q, r#"{"uids":"all"}"#, true).await;
    checker.call(&server, "POST", q, q, "not json", true).await;

    checker.call(&server, "GET", "/v1/online", "/v1/online", "", true).await;
    let o = "/v1/online/uids";
    let (_, page) = checker.call(&server, "GET", o, "/v1/online/uids?limit=1", "", true).await;
    let next = format!("/v1/online/uids?limit=1&cursor={}", page["cursor"].as_str().unwrap_or_default());
    checker.call(&server, "GET", o, &next, "", true).await;
    checker.call(&server, "GET", o, "/v1/online/uids?cursor=nonsense", "", true).await;

    let push = "/v1/push";
    let (_, pushed) = checker.call(&server, "POST", push, push, r#"{"uids":[42,43],"payload":"aGk="}"#, true).await;
    assert_eq!(pushed["sessions"], 1);
    checker.call(&server, "POST", push, push, r#"{"uids":[42],"payload":"!!"}"#, true).await;
    checker.call(&server, "POST", push, push, r#"{"uids":[42],"payload":"aGk=","device":"a/b"}"#, true).await;

    let w = "/v1/watchlists/{uid}";
    let (_, list) = checker.call(&server, "PUT", w, "/v1/watchlists/42", r#"{"uids":[8,"7",8]}"#, true).await;
    assert_eq!(list, json!({"uid": 42, "uids": ["7", "8"]}));
    checker.call(&server, "PUT", w, "/v1/watchlists/41", r#"{"uids":[1,2]}"#, true).await;
    checker.call(&server, "PUT", w, "/v1/watchlists/41", r#"{"uids":[1,2,3,4]}"#, true).await;
    checker.call(&server, "PUT", w, "/v1/watchlists/41", r#"{"uids":"all"}"#, true).await;
    checker.call(&server, "GET", w, "/v1/watchlists/42", "", true).await;
    checker.call(&server, "GET", w, "/v1/watchlists/41", "", true).await;
    checker.call(&server, "GET", w, "/v1/watchlists/x", "", true).await;
    checker.call(&server, "DELETE", w, "/v1/watchlists/42", "", true).await;
    checker.call(&server, "DELETE", w, "/v1/watchlists/42", "", true).await;
    checker.call(&server, "DELETE", w, "/v1/watchlists/x", "", true).await;

    let e = "/v1/events";
    checker.call(&server, "GET", e, "/v1/events?tail=many", "", true).await;
    checker.call(&server, "GET", e, "/v1/events?colour=blue", "", true).await;
    checker.call(&server, "GET", "/v1/openapi.json", "/v1/openapi.json", "", true).await;

    let s = "/v1/sessions/{uid}";
    checker.call(&server, "DELETE", s, "/v1/sessions/43", "", true).await;
    checker.call(&server, "DELETE", s, "/v1/sessions/42?device=tablet", "", true).await;
    checker.call(&server, "DELETE", s, "/v1/sessions/42?colour=blue", "", true).await;
    checker.call(&server, "DELETE", s, "/v1/sessions/42?device=phone", "", true).await;
    checker.call(&server, "GET", p, "/v1/presence/42", "", true).await;

    // The stream's events, each against the schema the document names for its type.
    let schemas = checker.doc["paths"][e]["get"]["x-idlegate-events"].clone();
    let mut types = BTreeSet::new();
    while types.len() < 6 {
        let event = tokio::time::timeout(PATIENCE, events.next()).await.expect("an event").expect("the stream");
        let schema = schemas.get(&event.event).unwrap_or_else(|| panic!("no schema for a {} event", event.event));
        checker.check(schema, &event.data, &format!("a {} event", event.event));
        types.insert(event.event);
    }
    let all = ["data", "offline", "online", "status", "user_offline", "user_online"];
    assert_eq!(types, all.map(String::from).into());
    // A resume from an id of no run of this log: a gap, whose schema holds too.
    let (_, mut resumed) = Sse::open(server.api, "/v1/events?after=1-0", &[&auth]).await;
    let gap = tokio::time::timeout(PATIENCE, resumed.next()).await.expect("an event").expect("the stream");
    assert_eq!(gap.event, "gap");
    checker.check(&schemas["gap"], &gap.data, "a gap event");

    // Every operation was called, on every status it lists but 413 and 503 (a body over
    // the limit and a store down have tests of their own: api.rs, redis_readiness.rs).
    let mut missing = Vec::new();
    for (path, item) in checker.doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            for status in operation["responses"].as_object().unwrap().keys() {
                let key = (path.clone(), method.clone(), status.clone());
                if !checker.seen.contains(&key) && status != "413" && status != "503" && status != "401" {
                    missing.push(format!("{method} {path} {status}"));
                }
            }
        }
    }
    assert!(missing.is_empty(), "documented but never answered: {missing:?}");
    server.shutdown().await;
}
