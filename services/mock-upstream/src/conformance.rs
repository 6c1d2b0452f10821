//! The fixtures the official MCP conformance suite
//! (`@modelcontextprotocol/conformance` 0.1.16) calls on a server: tools,
//! resources, prompts and completion with the names and shapes its scenarios
//! check. With `--conformance` the mock serves exactly these, so the suite can
//! run against the router with this mock behind it.

use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::session::Session;

/// A 1x1 PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// A minimal WAV file.
const WAV: &str = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA=";

fn tool(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "description": description, "inputSchema": schema})
}

fn empty_schema() -> Value {
    json!({"type": "object", "properties": {}})
}

/// `tools/list`.
pub fn tools() -> Value {
    json!({"tools": [
        tool("test_simple_text", "Tests simple text content response", empty_schema()),
        tool("test_image_content", "Tests image content response", empty_schema()),
        tool("test_audio_content", "Tests audio content response", empty_schema()),
        tool("test_embedded_resource", "Tests embedded resource content response", empty_schema()),
        tool("test_multiple_content_types", "Tests response with multiple content types (text, image, resource)", empty_schema()),
        tool("test_tool_with_logging", "Tests tool that emits log messages during execution", empty_schema()),
        tool("test_tool_with_progress", "Tests tool that reports progress notifications", empty_schema()),
        tool("test_error_handling", "Tests error response handling", empty_schema()),
        tool("test_sampling", "Tests server-initiated sampling (LLM completion request)",
            json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]})),
        tool("test_elicitation", "Tests server-initiated elicitation (user input request)",
            json!({"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]})),
        tool("test_elicitation_sep1034_defaults", "Tests elicitation with default values per SEP-1034", empty_schema()),
        tool("test_elicitation_sep1330_enums", "Tests elicitation with enum schema improvements per SEP-1330", empty_schema()),
        tool("test_reconnection", "Tests SSE stream disconnection and client reconnection (SEP-1699). Server will close the stream mid-call and send the result after client reconnects.", empty_schema()),
        tool("json_schema_2020_12_tool", "Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613, SEP-2106)", json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {"address": {"$anchor": "addressDef", "type": "object",
                                  "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
            "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"},
                           "contactMethod": {"type": "string", "enum": ["phone", "email"]},
                           "phone": {"type": "string"}, "email": {"type": "string"}},
            "allOf": [{"anyOf": [{"required": ["phone"]}, {"required": ["email"]}]}],
            "if": {"properties": {"contactMethod": {"const": "phone"}}, "required": ["contactMethod"]},
            "then": {"required": ["phone"]},
            "else": {"required": ["email"]},
            "additionalProperties": false
        })),
        tool("test_logging_tool", "Sends log messages at several levels (only those at or above the request's log level in 2026-07-28), then answers", empty_schema()),
        tool("test_trigger_tool_change", "Announces a change of the tool list (notifications/tools/list_changed) to every listener", empty_schema()),
        tool("test_trigger_prompt_change", "Announces a change of the prompt list (notifications/prompts/list_changed) to every listener", empty_schema()),
        tool("test_missing_capability", "Needs the client's sampling capability: without it the call fails with -32021", empty_schema()),
        tool("test_streaming_elicitation", "Asks for a confirmation by elicitation, answering on an SSE stream", empty_schema()),
        tool("test_input_required_result_elicitation", "Asks the user's name by elicitation (input_required), then greets", empty_schema()),
        tool("test_input_required_result_sampling", "Asks the client's model a question (input_required), then answers with it", empty_schema()),
        tool("test_input_required_result_list_roots", "Asks the client's roots (input_required), then lists them", empty_schema()),
        tool("test_input_required_result_request_state", "Asks a confirmation with a requestState it validates on the retry", empty_schema()),
        tool("test_input_required_result_multiple_inputs", "Asks by elicitation, sampling and roots/list at once", empty_schema()),
        tool("test_input_required_result_multi_round", "Asks two questions in two rounds, carrying the first answer in requestState", empty_schema()),
        tool("test_input_required_result_tampered_state", "Asks a confirmation with an integrity-protected requestState; an altered state is refused", empty_schema()),
        tool("test_input_required_result_capabilities", "Asks only by the means (sampling, elicitation) the client declared", empty_schema()),
        tool("test_header_param", "Echoes `region`, which the client mirrors into the Mcp-Param-Region header", json!({
            "type": "object",
            "properties": {"region": {"type": "string", "description": "A region name", "x-mcp-header": "Region"}}
        })),
    ]})
}

/// The log messages of `test_logging_tool`: (level, text).
pub const LOG_LINES: &[(&str, &str)] =
    &[("debug", "Debug details"), ("info", "Tool execution started"), ("warning", "Tool is almost done")];

/// A result with one text block.
pub fn text(t: &str) -> Value {
    json!({"content": [{"type": "text", "text": t}]})
}

/// The result of a tool that answers at once; `None` for the streamed ones.
pub fn immediate(name: &str, args: &Value) -> Option<Value> {
    Some(match name {
        "test_simple_text" => text("This is a simple text response for testing."),
        "test_image_content" => json!({"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}),
        "test_audio_content" => json!({"content": [{"type": "audio", "data": WAV, "mimeType": "audio/wav"}]}),
        "test_embedded_resource" => json!({"content": [{"type": "resource", "resource": {
            "uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content."}}]}),
        "test_multiple_content_types" => json!({"content": [
            {"type": "text", "text": "Multiple content types test:"},
            {"type": "image", "data": PNG, "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "test://mixed-content-resource", "mimeType": "application/json",
                "text": "{\"test\":\"data\",\"value\":123}"}}
        ]}),
        "test_error_handling" => json!({"content": [{"type": "text",
            "text": "This tool intentionally returns an error for testing"}], "isError": true}),
        "json_schema_2020_12_tool" => text("JSON Schema 2020-12 tool called"),
        "test_header_param" => text(&format!("region: {}", args["region"].as_str().unwrap_or("(none)"))),
        _ => return None,
    })
}

/// Whether `name` is one of the tools that stream (notifications or requests first).
pub fn is_streamed(name: &str) -> bool {
    matches!(
        name,
        "test_tool_with_logging"
            | "test_logging_tool"
            | "test_tool_with_progress"
            | "test_sampling"
            | "test_elicitation"
            | "test_elicitation_sep1034_defaults"
            | "test_elicitation_sep1330_enums"
    )
}

fn notify(out: &mpsc::UnboundedSender<Bytes>, method: &str, params: Value) {
    let params = serde_json::to_vec(&params).expect("serializable");
    let _ = out.send(switchboard_protocol::jsonrpc::request(None, method, Some(&params)));
}

/// Runs a streamed tool: sends its notifications and requests on `out`,
/// returns its result.
pub async fn streamed(
    session: &Session,
    name: &str,
    args: &Value,
    token: Option<&str>,
    out: &mpsc::UnboundedSender<Bytes>,
) -> Result<Value, String> {
    match name {
        "test_tool_with_logging" => {
            for (i, message) in
                ["Tool execution started", "Tool processing data", "Tool execution completed"].iter().enumerate()
            {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                notify(out, "notifications/message", json!({"level": "info", "data": message}));
            }
            Ok(text("Tool with logging executed successfully"))
        }
        "test_logging_tool" => {
            for (level, message) in LOG_LINES {
                notify(
                    out,
                    "notifications/message",
                    json!({"level": level, "logger": "test_logging_tool", "data": message}),
                );
            }
            Ok(text("Logging tool finished"))
        }
        "test_tool_with_progress" => {
            let token: Value = token.and_then(|t| serde_json::from_str(t).ok()).unwrap_or(Value::Null);
            for (i, progress) in [0, 50, 100].into_iter().enumerate() {
                if i > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                if !token.is_null() {
                    notify(
                        out,
                        "notifications/progress",
                        json!({"progressToken": token, "progress": progress, "total": 100,
                        "message": format!("Completed step {progress} of 100")}),
                    );
                }
            }
            Ok(text(&match &token {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }))
        }
        "test_sampling" => {
            let answer = session.ask(out, "sampling/createMessage", sampling_params(args)).await?;
            Ok(sampled(&answer))
        }
        "test_elicitation" | "test_elicitation_sep1034_defaults" | "test_elicitation_sep1330_enums" => {
            let (label, params) = elicitation(name, args).expect("an elicitation tool");
            let answer = session.ask(out, "elicitation/create", params).await?;
            Ok(text(&elicited(label, &answer)))
        }
        other => Err(format!("not a streamed conformance tool: {other}")),
    }
}

/// The `sampling/createMessage` params of `test_sampling`.
pub fn sampling_params(args: &Value) -> Value {
    let prompt = args["prompt"].as_str().unwrap_or("Hello");
    json!({"messages": [{"role": "user", "content": {"type": "text", "text": prompt}}], "maxTokens": 100})
}

/// The result of `test_sampling` once the client answered.
pub fn sampled(answer: &Value) -> Value {
    text(&format!("LLM response: {}", answer["content"]["text"].as_str().unwrap_or_default()))
}

/// The label of the answer and the `elicitation/create` params of the
/// elicitation tools; `None` for other tools.
pub fn elicitation(name: &str, args: &Value) -> Option<(&'static str, Value)> {
    Some(match name {
        "test_elicitation" => {
            let message = args["message"].as_str().unwrap_or("Please provide your information");
            (
                "User response",
                json!({"mode": "form", "message": message, "requestedSchema": {
                "type": "object",
                "properties": {"username": {"type": "string", "description": "User's response"},
                               "email": {"type": "string", "description": "User's email address"}},
                "required": ["username", "email"]}}),
            )
        }
        "test_elicitation_sep1034_defaults" => (
            "Elicitation completed",
            json!({"mode": "form",
            "message": "Please review and update the form fields with defaults",
            "requestedSchema": {"type": "object", "required": [], "properties": {
                "name": {"type": "string", "description": "User name", "default": "John Doe"},
                "age": {"type": "integer", "description": "User age", "default": 30},
                "score": {"type": "number", "description": "User score", "default": 95.5},
                "status": {"type": "string", "description": "User status",
                           "enum": ["active", "inactive", "pending"], "default": "active"},
                "verified": {"type": "boolean", "description": "Verification status", "default": true}}}}),
        ),
        "test_elicitation_sep1330_enums" => (
            "Elicitation completed",
            json!({"mode": "form",
            "message": "Please select options from the enum fields",
            "requestedSchema": {"type": "object", "required": [], "properties": {
                "untitledSingle": {"type": "string", "description": "Select one option",
                                   "enum": ["option1", "option2", "option3"]},
                "titledSingle": {"type": "string", "description": "Select one option with titles",
                                 "oneOf": [{"const": "value1", "title": "First Option"},
                                           {"const": "value2", "title": "Second Option"},
                                           {"const": "value3", "title": "Third Option"}]},
                "legacyEnum": {"type": "string", "description": "Select one option (legacy)",
                               "enum": ["opt1", "opt2", "opt3"],
                               "enumNames": ["Option One", "Option Two", "Option Three"]},
                "untitledMulti": {"type": "array", "description": "Select multiple options", "minItems": 1,
                                  "maxItems": 3, "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                "titledMulti": {"type": "array", "description": "Select multiple options with titles",
                                "minItems": 1, "maxItems": 3, "items": {"anyOf": [
                                    {"const": "value1", "title": "First Choice"},
                                    {"const": "value2", "title": "Second Choice"},
                                    {"const": "value3", "title": "Third Choice"}]}}}}}),
        ),
        _ => return None,
    })
}

/// The text of an elicitation tool's result.
pub fn elicited(label: &str, answer: &Value) -> String {
    let action = answer["action"].as_str().unwrap_or("unknown");
    let content = answer.get("content").cloned().unwrap_or(json!({}));
    format!("{label}: action={action}, content={content}")
}

/// `resources/list`.
pub fn resources() -> Value {
    json!({"resources": [
        {"uri": "test://static-text", "name": "static-text", "title": "Static Text Resource",
         "description": "A static text resource for testing", "mimeType": "text/plain"},
        {"uri": "test://static-binary", "name": "static-binary", "title": "Static Binary Resource",
         "description": "A static binary resource (image) for testing", "mimeType": "image/png"},
        {"uri": "test://watched-resource", "name": "watched-resource", "title": "Watched Resource",
         "description": "A resource that can be subscribed to", "mimeType": "text/plain"},
    ]})
}

/// `resources/templates/list`.
pub fn templates() -> Value {
    json!({"resourceTemplates": [
        {"uriTemplate": "test://template/{id}/data", "name": "template", "title": "Resource Template",
         "description": "A resource template with parameter substitution", "mimeType": "application/json"},
    ]})
}

/// `resources/read`; `None` for an unknown URI.
pub fn read(uri: &str) -> Option<Value> {
    let content = match uri {
        "test://static-text" => {
            json!({"uri": uri, "mimeType": "text/plain", "text": "This is the content of the static text resource."})
        }
        "test://static-binary" => json!({"uri": uri, "mimeType": "image/png", "blob": PNG}),
        "test://watched-resource" => json!({"uri": uri, "mimeType": "text/plain", "text": "Watched resource content"}),
        _ => {
            let id = uri.strip_prefix("test://template/")?.strip_suffix("/data")?;
            let data = json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")});
            json!({"uri": uri, "mimeType": "application/json", "text": data.to_string()})
        }
    };
    Some(json!({"contents": [content]}))
}

/// `prompts/list`.
pub fn prompts() -> Value {
    json!({"prompts": [
        {"name": "test_simple_prompt", "title": "Simple Test Prompt", "description": "A simple prompt without arguments"},
        {"name": "test_prompt_with_arguments", "title": "Prompt With Arguments", "description": "A prompt with required arguments",
         "arguments": [{"name": "arg1", "description": "First test argument", "required": true},
                       {"name": "arg2", "description": "Second test argument", "required": true}]},
        {"name": "test_prompt_with_embedded_resource", "title": "Prompt With Embedded Resource",
         "description": "A prompt that includes an embedded resource",
         "arguments": [{"name": "resourceUri", "description": "URI of the resource to embed", "required": true}]},
        {"name": "test_prompt_with_image", "title": "Prompt With Image", "description": "A prompt that includes image content"},
        {"name": "test_input_required_result_prompt", "title": "Prompt Needing Context",
         "description": "A prompt that asks the user for context (input_required) before it is built"},
    ]})
}

/// `prompts/get`; `None` for an unknown prompt.
pub fn prompt(name: &str, args: &Value) -> Option<Value> {
    let user = |content: Value| json!({"role": "user", "content": content});
    let messages = match name {
        "test_simple_prompt" => vec![user(json!({"type": "text", "text": "This is a simple prompt for testing."}))],
        "test_prompt_with_arguments" => {
            let arg1 = args["arg1"].as_str().unwrap_or_default();
            let arg2 = args["arg2"].as_str().unwrap_or_default();
            vec![user(json!({"type": "text", "text": format!("Prompt with arguments: arg1='{arg1}', arg2='{arg2}'")}))]
        }
        "test_prompt_with_embedded_resource" => {
            let uri = args["resourceUri"].as_str().unwrap_or("test://example-resource");
            vec![
                user(json!({"type": "resource", "resource": {"uri": uri, "mimeType": "text/plain",
                    "text": "Embedded resource content for testing."}})),
                user(json!({"type": "text", "text": "Please process the embedded resource above."})),
            ]
        }
        "test_prompt_with_image" => vec![
            user(json!({"type": "image", "data": PNG, "mimeType": "image/png"})),
            user(json!({"type": "text", "text": "Please analyze the image above."})),
        ],
        _ => return None,
    };
    Some(json!({"messages": messages}))
}

/// `completion/complete`.
pub fn complete(args: &Value) -> Value {
    let prefix = args["argument"]["value"].as_str().unwrap_or("");
    let values: Vec<&str> = ["paris", "park", "party"].into_iter().filter(|v| v.starts_with(prefix)).collect();
    json!({"completion": {"values": values, "total": values.len(), "hasMore": false}})
}
