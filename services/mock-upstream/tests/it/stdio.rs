//! The mock binary over stdio answers line by line.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

#[test]
fn answers_initialize_and_calls_over_stdio() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchboard-mock"))
        .args(["--stdio", "--name", "s"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the mock");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"t","version":"0"}}}}}}"#).unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let init: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(init["result"]["serverInfo"]["name"], "s");
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":"two","method":"tools/call","params":{{"name":"echo","arguments":{{"a":[1]}}}}}}"#
    )
    .unwrap();
    line.clear();
    stdout.read_line(&mut line).unwrap();
    let echo: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(echo["id"], "two");
    assert_eq!(echo["result"]["content"][0]["text"], r#"{"a":[1]}"#);
    drop(stdin);
    assert!(child.wait().unwrap().success(), "the mock exits when stdin closes");
}
