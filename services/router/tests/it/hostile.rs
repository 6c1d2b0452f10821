//! Careless or hostile peers on either side: what a client can slip past
//! the router (repeated members, odd ids), what an upstream can answer
//! (another request's id).

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;
use switchboard_mock::AnswerIds;
use switchboard_test_support::{eventually, http_upstream, mock_named, Client, MockOptions, MockServer, Router};

use crate::routing::config;

fn call(id: &str, params: &str) -> bytes::Bytes {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{params}}}"#).into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_member_the_router_reads_or_records_is_refused_not_forwarded() {
    let web = MockServer::start(mock_named("web")).await;
    let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
    let mut client = Client::new(&router.url);
    client.initialize().await;
    for params in [
        // The upstream would run the second, the audit would record none.
        r#"{"name":"web__echo","arguments":{"text":"shown"},"arguments":{"text":"hidden"}}"#,
        r#"{"name":"web__echo","arguments":{},"_meta":{"progressToken":1,"progressToken":2}}"#,
        r#"{"name":"web__echo","arguments":{},"_meta":{},"_meta":{"progressToken":2}}"#,
    ] {
        let reply = client.post_raw(call("5", params), &[]).await;
        let answer = reply.json();
        assert_eq!(answer["id"], 5, "{answer}");
        assert_eq!(answer["error"]["code"], -32602, "{params}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains("duplicate field"), "{answer}");
    }
    assert_eq!(web.mock.call_count(), 0, "nothing was forwarded");
    // Members the router neither reads nor records may repeat (JSON allows
    // it); the upstream decides what they mean.
    let reply = client
        .post_raw(call("6", r#"{"name":"web__echo","arguments":{"text":"a","text":"b"},"x":1,"x":2}"#), &[])
        .await;
    assert!(reply.json()["result"].is_object(), "{}", reply.json());
    assert_eq!(web.mock.call_count(), 1);
    // The router is still healthy.
    assert!(client.call_tool("web__echo", serde_json::json!({"text": "ok"})).await["result"].is_object());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_json_rpc_id_round_trips_through_an_upstream_that_reprints_numbers() {
    // A JavaScript server answers `1.0` as `1`: the router must not lose
    // the answer, whether it comes as JSON or in an SSE stream.
    for always_sse in [false, true] {
        let web =
            MockServer::start(MockOptions { answer_ids: AnswerIds::AsJavaScript, always_sse, ..mock_named("web") })
                .await;
        let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        for id in ["1.0", "1E2", "-0", "2.5e-3", "123456789012345678901", "7", r#""sb~7""#, r#""a\u00e9""#] {
            let reply = client.post_raw(call(id, r#"{"name":"web__echo","arguments":{"text":"x"}}"#), &[]).await;
            assert_eq!(reply.status, StatusCode::OK);
            let text = String::from_utf8_lossy(&reply.body).into_owned();
            assert!(
                text.contains(&format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#)),
                "sse={always_sse}: id {id} must come back as the client wrote it: {text}"
            );
        }
        assert_eq!(web.mock.call_count(), 8);
        // A cancellation naming such an id reaches the upstream under the
        // id it knows: nothing is in flight here, so check the mapping by a
        // call that is (the slow tool), cancelled by the client.
        let slow = client.clone();
        let call_slow = tokio::spawn(async move {
            slow.post_raw(call("3.0", r#"{"name":"web__sleep","arguments":{"ms":30000}}"#), &[]).await
        });
        let reached = eventually(Duration::from_secs(10), || async { web.mock.call_count() == 9 }).await;
        assert!(reached, "the slow call reached the upstream");
        let cancel = r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3.0}}"#;
        assert_eq!(client.post_raw(cancel.into(), &[]).await.status, StatusCode::ACCEPTED);
        let cancelled =
            eventually(Duration::from_secs(10), || async { web.mock.cancelled().iter().any(|id| id == r#""sb~3.0""#) })
                .await;
        assert!(cancelled, "the upstream got the cancellation under its id: {:?}", web.mock.cancelled());
        call_slow.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_under_another_requests_id_is_dropped_and_the_request_gets_an_error() {
    for always_sse in [false, true] {
        let web =
            MockServer::start(MockOptions { answer_ids: AnswerIds::Stray, always_sse, ..mock_named("web") }).await;
        let router = Router::start(&config(&http_upstream("web", &web.url, ""))).await;
        let mut client = Client::new(&router.url);
        client.initialize().await;
        let reply = client.post_raw(call("42", r#"{"name":"web__echo","arguments":{"text":"x"}}"#), &[]).await;
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(!text.contains("1042"), "sse={always_sse}: another id's answer was delivered: {text}");
        let answer: Value = if always_sse {
            let data = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .next_back()
                .unwrap_or_else(|| panic!("no event in {text:?}"));
            serde_json::from_str(data).unwrap()
        } else {
            reply.json()
        };
        assert_eq!(answer["id"], 42, "{answer}");
        assert!(answer["result"].is_null(), "{answer}");
        assert!(answer["error"]["code"].is_i64(), "{answer}");
        let dropped = router.metric("switchboard_relay_dropped_total", &["upstream=\"web\"", "stray_response"]).await;
        assert_eq!(dropped, 1.0, "sse={always_sse}");
    }
}
