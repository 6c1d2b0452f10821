//! Checks a value against the subset of JSON Schema that edge devices
//! declare for their services: `type` (one or a list), `required`,
//! `properties`, `additionalProperties: false`, `items`, `enum`, `const`,
//! `minimum`/`maximum`, `exclusiveMinimum`/`exclusiveMaximum`,
//! `minLength`/`maxLength` (in characters) and `minItems`/`maxItems`.
//! Other keywords are ignored (the device still sees the value and may
//! refuse it itself).
//!
//! The first failure is reported with its path from the root
//! (`arguments.format`, `arguments.files[2].name`).

use serde_json::{Map, Value};

/// Why a value does not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct Invalid {
    /// Where: the root's name, then `.member` and `[index]` steps.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

/// Checks `value` against `schema`; `root` names the value in error paths.
pub fn check(schema: &Value, value: &Value, root: &str) -> Result<(), Invalid> {
    let mut path = root.to_owned();
    walk(schema, value, &mut path)
}

fn fail(path: &str, message: String) -> Result<(), Invalid> {
    Err(Invalid { path: path.to_owned(), message })
}

fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if is_integer(n) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integer(n: &serde_json::Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

fn has_type(value: &Value, wanted: &str) -> bool {
    match (wanted, value) {
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => is_integer(n),
        _ => type_name(value) == wanted || (wanted == "number" && type_name(value) == "integer"),
    }
}

fn walk(schema: &Value, value: &Value, path: &mut String) -> Result<(), Invalid> {
    let Value::Object(schema) = schema else {
        // `true` (or anything that is not a schema object) accepts all;
        // `false` accepts nothing.
        return if schema == &Value::Bool(false) { fail(path, "no value is allowed here".into()) } else { Ok(()) };
    };
    if let Some(wanted) = schema.get("type") {
        let names: Vec<&str> = match wanted {
            Value::String(s) => vec![s.as_str()],
            Value::Array(list) => list.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if !names.is_empty() && !names.iter().any(|t| has_type(value, t)) {
            let expected = names.join(" or ");
            return fail(path, format!("must be of type {expected}, not {}", type_name(value)));
        }
    }
    if let Some(Value::Array(options)) = schema.get("enum") {
        if !options.contains(value) {
            let shown: Vec<String> = options.iter().map(Value::to_string).collect();
            return fail(path, format!("must be one of {}", shown.join(", ")));
        }
    }
    if let Some(expected) = schema.get("const") {
        if expected != value {
            return fail(path, format!("must be {expected}"));
        }
    }
    match value {
        Value::Number(n) => numbers(schema, n.as_f64().unwrap_or(f64::NAN), path)?,
        Value::String(s) => {
            let chars = s.chars().count();
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
                if (chars as u64) < min {
                    return fail(path, format!("must be at least {min} characters long (it has {chars})"));
                }
            }
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                if chars as u64 > max {
                    return fail(path, format!("must be at most {max} characters long (it has {chars})"));
                }
            }
        }
        Value::Array(items) => {
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64) {
                if (items.len() as u64) < min {
                    return fail(path, format!("must have at least {min} items"));
                }
            }
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64) {
                if items.len() as u64 > max {
                    return fail(path, format!("must have at most {max} items"));
                }
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("[{i}]"));
                    walk(item_schema, item, path)?;
                    path.truncate(len);
                }
            }
        }
        Value::Object(members) => object(schema, members, path)?,
        _ => {}
    }
    Ok(())
}

fn numbers(schema: &Map<String, Value>, n: f64, path: &str) -> Result<(), Invalid> {
    let bound = |key: &str| schema.get(key).and_then(Value::as_f64);
    if let Some(min) = bound("minimum") {
        if n < min {
            return fail(path, format!("must be at least {min}"));
        }
    }
    if let Some(max) = bound("maximum") {
        if n > max {
            return fail(path, format!("must be at most {max}"));
        }
    }
    if let Some(min) = bound("exclusiveMinimum") {
        if n <= min {
            return fail(path, format!("must be greater than {min}"));
        }
    }
    if let Some(max) = bound("exclusiveMaximum") {
        if n >= max {
            return fail(path, format!("must be less than {max}"));
        }
    }
    Ok(())
}

fn object(schema: &Map<String, Value>, members: &Map<String, Value>, path: &mut String) -> Result<(), Invalid> {
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !members.contains_key(name) {
                return fail(path, format!("{name:?} is required"));
            }
        }
    }
    let properties = schema.get("properties").and_then(Value::as_object);
    for (name, member) in members {
        let len = path.len();
        path.push('.');
        path.push_str(name);
        match properties.and_then(|p| p.get(name)) {
            Some(member_schema) => walk(member_schema, member, path)?,
            None => {
                if let Some(extra) = schema.get("additionalProperties") {
                    if extra == &Value::Bool(false) {
                        return fail(path, "is not an accepted parameter".into());
                    }
                    walk(extra, member, path)?;
                }
            }
        }
        path.truncate(len);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(schema: Value, value: Value) -> String {
        check(&schema, &value, "arguments").unwrap_err().to_string()
    }

    #[test]
    fn accepts_what_matches() {
        let schema = json!({
            "type": "object",
            "properties": {
                "format": {"type": "string", "enum": ["simple", "detailed"]},
                "count": {"type": "integer", "minimum": 1, "maximum": 10},
                "ratio": {"type": ["number", "null"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}},
            },
            "required": ["format"],
        });
        check(&schema, &json!({"format": "simple", "count": 3, "ratio": 0.5, "tags": ["a", "bcd"]}), "arguments")
            .unwrap();
        check(&schema, &json!({"format": "detailed", "count": 10.0, "ratio": null}), "arguments").unwrap();
        check(&json!({}), &json!(42), "arguments").unwrap();
    }

    #[test]
    fn names_the_failing_path() {
        let schema = json!({
            "type": "object",
            "properties": {
                "format": {"type": "string", "enum": ["simple", "detailed"]},
                "count": {"type": "integer", "minimum": 1, "maximum": 10},
                "name": {"type": "string", "minLength": 2, "maxLength": 4},
                "files": {"type": "array", "items": {"type": "object", "required": ["name"]}},
            },
            "required": ["format"],
            "additionalProperties": false,
        });
        assert_eq!(err(schema.clone(), json!({})), r#"arguments: "format" is required"#);
        assert_eq!(
            err(schema.clone(), json!({"format": "long"})),
            r#"arguments.format: must be one of "simple", "detailed""#
        );
        assert_eq!(err(schema.clone(), json!({"format": 1})), "arguments.format: must be of type string, not integer");
        assert_eq!(err(schema.clone(), json!({"format": "simple", "count": 0})), "arguments.count: must be at least 1");
        assert_eq!(
            err(schema.clone(), json!({"format": "simple", "count": 11})),
            "arguments.count: must be at most 10"
        );
        assert_eq!(
            err(schema.clone(), json!({"format": "simple", "count": 1.5})),
            "arguments.count: must be of type integer, not number"
        );
        assert_eq!(
            err(schema.clone(), json!({"format": "simple", "name": "é"})),
            "arguments.name: must be at least 2 characters long (it has 1)"
        );
        assert_eq!(
            err(schema.clone(), json!({"format": "simple", "name": "ééééé"})),
            "arguments.name: must be at most 4 characters long (it has 5)"
        );
        assert_eq!(
            err(schema.clone(), json!({"format": "simple", "files": [{"name": "a"}, {}]})),
            r#"arguments.files[1]: "name" is required"#
        );
        assert_eq!(
            err(schema, json!({"format": "simple", "other": 1})),
            "arguments.other: is not an accepted parameter"
        );
        assert_eq!(err(json!({"type": "object"}), json!([1])), "arguments: must be of type object, not array");
    }
}
