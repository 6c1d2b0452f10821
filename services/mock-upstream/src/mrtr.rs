//! Tools and prompts that need input from the client (elicitation, sampling,
//! roots), written once as round-based programs and served in both eras.
//!
//! A program looks at one round (the arguments, the client's capabilities,
//! the answers it got and the state it left) and either finishes, asks for
//! more input, or fails. In 2026-07-28 each round is one request: an
//! `input_required` result carries the questions and a sealed
//! `requestState`, and the client retries with `inputResponses`. For a 2025
//! session the same program is driven by server-to-client requests on the
//! response stream ([`drive`]).

use serde_json::{json, Map, Value};
use switchboard_protocol::jsonrpc::code;
use tokio::sync::mpsc;

use bytes::Bytes;

use crate::conformance;
use crate::session::Session;

/// What a program is reached by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Tool,
    Prompt,
}

/// A JSON-RPC error a round ends with.
#[derive(Debug)]
pub struct Failure {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
    /// HTTP 400 in 2026-07-28 (a missing client capability); 200 otherwise.
    pub bad_request: bool,
}

impl Failure {
    fn invalid(message: String) -> Failure {
        Failure { code: code::INVALID_PARAMS, message, data: None, bad_request: false }
    }
}

/// The outcome of one round.
#[derive(Debug)]
pub enum Step {
    /// The result (without `resultType`).
    Done(Value),
    /// Questions by key (`{"method", "params"}`), and the state to carry.
    Ask {
        requests: Map<String, Value>,
        state: Value,
    },
    Fail(Failure),
}

/// One round's input.
pub struct Round<'a> {
    pub args: &'a Value,
    /// The client's capabilities; `None` in a 2025 session, where the
    /// client declared them at `initialize` and the mock takes them all.
    pub caps: Option<&'a Value>,
    pub responses: &'a Map<String, Value>,
    /// The state the previous round left, once verified.
    pub state: Option<&'a Value>,
}

const CONFORMANCE_TOOLS: &[&str] = &[
    "test_input_required_result_elicitation",
    "test_input_required_result_sampling",
    "test_input_required_result_list_roots",
    "test_input_required_result_request_state",
    "test_input_required_result_multiple_inputs",
    "test_input_required_result_multi_round",
    "test_input_required_result_tampered_state",
    "test_input_required_result_capabilities",
    "test_missing_capability",
    "test_streaming_elicitation",
    "test_sampling",
    "test_elicitation",
    "test_elicitation_sep1034_defaults",
    "test_elicitation_sep1330_enums",
];

/// Whether `name` is a program in this mode.
pub fn is_program(conformance: bool, kind: Kind, name: &str) -> bool {
    match (conformance, kind) {
        (true, Kind::Tool) => CONFORMANCE_TOOLS.contains(&name),
        (true, Kind::Prompt) => name == "test_input_required_result_prompt",
        (false, Kind::Tool) => matches!(name, "sample" | "elicit" | "roots"),
        (false, Kind::Prompt) => false,
    }
}

fn elicit(message: &str, property: &str) -> Value {
    json!({"method": "elicitation/create", "params": {"mode": "form", "message": message, "requestedSchema": {
        "type": "object", "properties": {property: {"type": "string"}}, "required": [property]}}})
}

fn confirm() -> Value {
    json!({"method": "elicitation/create", "params": {"mode": "form", "message": "Please confirm", "requestedSchema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}}})
}

fn sample(text: &str, max_tokens: u32) -> Value {
    json!({"method": "sampling/createMessage", "params": {
        "messages": [{"role": "user", "content": {"type": "text", "text": text}}], "maxTokens": max_tokens}})
}

fn roots() -> Value {
    json!({"method": "roots/list", "params": {}})
}

/// Fails with -32021 unless the client declared every one of `needed`.
fn require(round: &Round<'_>, needed: &[&str]) -> Result<(), Failure> {
    let Some(caps) = round.caps else { return Ok(()) };
    let missing: Map<String, Value> = needed
        .iter()
        .filter(|c| caps.get(**c).is_none_or(Value::is_null))
        .map(|c| (c.to_string(), json!({})))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let names: Vec<&String> = missing.keys().collect();
    Err(Failure {
        code: -32021,
        message: format!("Missing required client capability: {names:?}"),
        data: Some(json!({"requiredCapabilities": missing})),
        bad_request: true,
    })
}

/// The answer to question `key` if the client gave a well-formed one for
/// a question by `method`.
fn answer<'a>(round: &Round<'a>, key: &str, method: &str) -> Result<Option<&'a Value>, Failure> {
    let Some(value) = round.responses.get(key) else { return Ok(None) };
    let ok = match method {
        "elicitation/create" => value["action"].as_str().is_some_and(|a| matches!(a, "accept" | "decline" | "cancel")),
        "sampling/createMessage" => value.get("content").is_some_and(|c| c.is_object() || c.is_array()),
        _ => value["roots"].is_array(),
    };
    if ok {
        Ok(Some(value))
    } else {
        Err(Failure::invalid(format!("inputResponses.{key} is not a valid answer to {method}")))
    }
}

fn text(t: &str) -> Value {
    conformance::text(t)
}

fn ask(pairs: Vec<(&str, Value)>, state: Value) -> Step {
    Step::Ask { requests: pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(), state }
}

fn said(sampled: &Value) -> String {
    sampled["content"]["text"].as_str().unwrap_or_default().to_owned()
}

fn root_list(answer: &Value) -> String {
    let uris: Vec<&str> = answer["roots"].as_array().into_iter().flatten().filter_map(|r| r["uri"].as_str()).collect();
    uris.join(", ")
}

/// Runs one round of program `name`.
pub fn run(kind: Kind, name: &str, round: &Round<'_>) -> Step {
    match run_checked(kind, name, round) {
        Ok(step) => step,
        Err(failure) => Step::Fail(failure),
    }
}

fn run_checked(kind: Kind, name: &str, round: &Round<'_>) -> Result<Step, Failure> {
    let state = round.state.cloned().unwrap_or(Value::Null);
    Ok(match (kind, name) {
        (Kind::Prompt, _) => {
            require(round, &["elicitation"])?;
            match answer(round, "user_context", "elicitation/create")? {
                Some(a) => {
                    let context = a["content"]["context"].as_str().unwrap_or("(none)");
                    Step::Done(json!({"messages": [{"role": "user", "content": {"type": "text",
                        "text": format!("Answer with this context in mind: {context}")}}]}))
                }
                None => {
                    ask(vec![("user_context", elicit("What context should the prompt use?", "context"))], json!({}))
                }
            }
        }
        (_, "test_input_required_result_elicitation") => {
            require(round, &["elicitation"])?;
            match answer(round, "user_name", "elicitation/create")? {
                Some(a) => {
                    Step::Done(text(&format!("Hello, {}!", a["content"]["name"].as_str().unwrap_or("stranger"))))
                }
                None => ask(vec![("user_name", elicit("What is your name?", "name"))], json!({})),
            }
        }
        (_, "test_input_required_result_sampling") => {
            require(round, &["sampling"])?;
            match answer(round, "capital_question", "sampling/createMessage")? {
                Some(a) => Step::Done(text(&format!("The model says: {}", said(a)))),
                None => ask(vec![("capital_question", sample("What is the capital of France?", 100))], json!({})),
            }
        }
        (_, "test_input_required_result_list_roots") => {
            require(round, &["roots"])?;
            match answer(round, "client_roots", "roots/list")? {
                Some(a) => Step::Done(text(&format!("Client roots: {}", root_list(a)))),
                None => ask(vec![("client_roots", roots())], json!({})),
            }
        }
        (_, "test_input_required_result_request_state" | "test_input_required_result_tampered_state") => {
            require(round, &["elicitation"])?;
            match answer(round, "confirm", "elicitation/create")? {
                // Finish only with the state this server issued for the question.
                Some(a) if state["asked"] == "confirm" => {
                    Step::Done(text(&format!("state-ok: confirmed={}", a["content"]["ok"])))
                }
                _ => ask(vec![("confirm", confirm())], json!({"asked": "confirm"})),
            }
        }
        (_, "test_input_required_result_multiple_inputs") => {
            require(round, &["elicitation", "sampling", "roots"])?;
            let name = answer(round, "user_name", "elicitation/create")?;
            let greeting = answer(round, "greeting", "sampling/createMessage")?;
            let client_roots = answer(round, "client_roots", "roots/list")?;
            match (name, greeting, client_roots) {
                (Some(n), Some(g), Some(r)) => Step::Done(text(&format!(
                    "{} {} (roots: {})",
                    said(g),
                    n["content"]["name"].as_str().unwrap_or("stranger"),
                    root_list(r)
                ))),
                (n, g, r) => {
                    let mut pairs = Vec::new();
                    if n.is_none() {
                        pairs.push(("user_name", elicit("What is your name?", "name")));
                    }
                    if g.is_none() {
                        pairs.push(("greeting", sample("Generate a greeting", 50)));
                    }
                    if r.is_none() {
                        pairs.push(("client_roots", roots()));
                    }
                    ask(pairs, json!({}))
                }
            }
        }
        (_, "test_input_required_result_multi_round") => {
            require(round, &["elicitation"])?;
            let step1 = answer(round, "step1", "elicitation/create")?;
            let step2 = answer(round, "step2", "elicitation/create")?;
            match (state["round"].as_u64().unwrap_or(0), step1, step2) {
                (2, _, Some(a)) => Step::Done(text(&format!(
                    "{} likes {}",
                    state["name"].as_str().unwrap_or("stranger"),
                    a["content"]["color"].as_str().unwrap_or("no colour")
                ))),
                (1, Some(a), _) => {
                    let name = a["content"]["name"].as_str().unwrap_or("stranger");
                    ask(
                        vec![("step2", elicit("Step 2: What is your favorite color?", "color"))],
                        json!({"round": 2, "name": name}),
                    )
                }
                (2, _, None) => ask(vec![("step2", elicit("Step 2: What is your favorite color?", "color"))], state),
                _ => ask(vec![("step1", elicit("Step 1: What is your name?", "name"))], json!({"round": 1})),
            }
        }
        (_, "test_input_required_result_capabilities") => {
            let caps = round.caps;
            let has = |c: &str| caps.is_none_or(|caps| caps.get(c).is_some_and(|v| !v.is_null()));
            let mut pairs = Vec::new();
            if has("sampling") && answer(round, "model_hint", "sampling/createMessage")?.is_none() {
                pairs.push(("model_hint", sample("Suggest a name for a cat", 20)));
            }
            if has("elicitation") && answer(round, "user_hint", "elicitation/create")?.is_none() {
                pairs.push(("user_hint", elicit("Suggest a name for a cat", "name")));
            }
            if !has("sampling") && !has("elicitation") {
                require(round, &["sampling"])?;
            }
            if pairs.is_empty() {
                Step::Done(text("Asked only by the declared capabilities"))
            } else {
                ask(pairs, json!({}))
            }
        }
        (_, "test_missing_capability") => {
            require(round, &["sampling"])?;
            match answer(round, "sampling", "sampling/createMessage")? {
                Some(a) => Step::Done(text(&format!("Sampling is available: {}", said(a)))),
                None => ask(vec![("sampling", sample("Say anything", 10))], json!({})),
            }
        }
        (_, "test_streaming_elicitation") => {
            require(round, &["elicitation"])?;
            match answer(round, "confirmation", "elicitation/create")? {
                Some(a) => Step::Done(text(&format!("Streaming elicitation answered: {}", a["action"]))),
                None => ask(vec![("confirmation", confirm())], json!({})),
            }
        }
        (_, "test_sampling") => {
            require(round, &["sampling"])?;
            match answer(round, "sampling", "sampling/createMessage")? {
                Some(a) => Step::Done(conformance::sampled(a)),
                None => ask(
                    vec![(
                        "sampling",
                        json!({"method": "sampling/createMessage", "params": conformance::sampling_params(round.args)}),
                    )],
                    json!({}),
                ),
            }
        }
        (_, "test_elicitation" | "test_elicitation_sep1034_defaults" | "test_elicitation_sep1330_enums") => {
            require(round, &["elicitation"])?;
            let (label, params) = conformance::elicitation(name, round.args).expect("an elicitation tool");
            match answer(round, "elicitation", "elicitation/create")? {
                Some(a) => Step::Done(text(&conformance::elicited(label, a))),
                None => {
                    ask(vec![("elicitation", json!({"method": "elicitation/create", "params": params}))], json!({}))
                }
            }
        }
        (_, "sample") => {
            require(round, &["sampling"])?;
            match answer(round, "sampling", "sampling/createMessage")? {
                Some(a) => Step::Done(text(&format!("sampled: {}", said(a)))),
                None => {
                    let prompt = round.args["prompt"].as_str().unwrap_or("hello");
                    ask(vec![("sampling", sample(prompt, 100))], json!({}))
                }
            }
        }
        (_, "elicit") => {
            require(round, &["elicitation"])?;
            match answer(round, "elicitation", "elicitation/create")? {
                Some(a) => Step::Done(text(&format!("elicited: {a}"))),
                None => {
                    let message = round.args["message"].as_str().unwrap_or("Please answer");
                    ask(
                        vec![(
                            "elicitation",
                            json!({"method": "elicitation/create", "params": {"mode": "form", "message": message,
                                "requestedSchema": {"type": "object", "properties": {"answer": {"type": "string"}}}}}),
                        )],
                        json!({}),
                    )
                }
            }
        }
        (_, "roots") => {
            require(round, &["roots"])?;
            match answer(round, "roots", "roots/list")? {
                Some(a) => Step::Done(text(&format!("roots: {}", a["roots"]))),
                None => ask(vec![("roots", roots())], json!({})),
            }
        }
        (_, other) => return Err(Failure::invalid(format!("Unknown tool: {other}"))),
    })
}

/// Runs a program for a 2025 session: each question becomes a
/// server-to-client request on `out`, until the program finishes.
pub async fn drive(
    session: &Session,
    kind: Kind,
    name: &str,
    args: &Value,
    out: &mpsc::UnboundedSender<Bytes>,
) -> Result<Value, Failure> {
    let mut responses = Map::new();
    let mut state: Option<Value> = None;
    for _ in 0..16 {
        let round = Round { args, caps: None, responses: &responses, state: state.as_ref() };
        match run(kind, name, &round) {
            Step::Done(result) => return Ok(result),
            Step::Fail(failure) => return Err(failure),
            Step::Ask { requests, state: next } => {
                responses = Map::new();
                for (key, request) in requests {
                    let method = request["method"].as_str().unwrap_or_default().to_owned();
                    let answer = session
                        .ask(out, &method, request["params"].clone())
                        .await
                        .map_err(|e| Failure::invalid(format!("{method} failed: {e}")))?;
                    responses.insert(key, answer);
                }
                state = Some(next);
            }
        }
    }
    Err(Failure::invalid(format!("{name} asked too many rounds")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round<'a>(caps: &'a Value, responses: &'a Map<String, Value>, state: Option<&'a Value>) -> Round<'a> {
        static ARGS: Value = Value::Null;
        Round { args: &ARGS, caps: Some(caps), responses, state }
    }

    #[test]
    fn a_program_asks_then_finishes() {
        let caps = json!({"elicitation": {}});
        let none = Map::new();
        let Step::Ask { requests, .. } =
            run(Kind::Tool, "test_input_required_result_elicitation", &round(&caps, &none, None))
        else {
            panic!("expected questions")
        };
        assert_eq!(requests["user_name"]["method"], "elicitation/create");
        let answers = json!({"user_name": {"action": "accept", "content": {"name": "Ada"}}});
        let step = run(
            Kind::Tool,
            "test_input_required_result_elicitation",
            &round(&caps, answers.as_object().unwrap(), None),
        );
        let Step::Done(result) = step else { panic!("expected a result: {step:?}") };
        assert_eq!(result["content"][0]["text"], "Hello, Ada!");
    }

    #[test]
    fn a_missing_capability_is_named() {
        let caps = json!({});
        let none = Map::new();
        let Step::Fail(failure) = run(Kind::Tool, "test_missing_capability", &round(&caps, &none, None)) else {
            panic!("expected a failure")
        };
        assert_eq!(failure.code, -32021);
        assert!(failure.bad_request);
        assert_eq!(failure.data.unwrap()["requiredCapabilities"], json!({"sampling": {}}));
    }

    #[test]
    fn a_malformed_answer_is_an_error() {
        let caps = json!({"elicitation": {}});
        let answers = json!({"user_name": 12345});
        let step = run(
            Kind::Tool,
            "test_input_required_result_elicitation",
            &round(&caps, answers.as_object().unwrap(), None),
        );
        assert!(matches!(step, Step::Fail(Failure { code: -32602, .. })), "{step:?}");
    }
}
