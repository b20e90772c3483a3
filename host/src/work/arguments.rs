//! A tool's arguments checked against its input schema (a JSON Schema), as far as tools'
//! arguments are usually described: the `required` properties present, and each property given
//! of the `type` its schema names. Used both ways of MCP: the calls the API serves
//! (`POST /mcp`) and the calls the host brokers for guests (`mcp-call`).

use serde_json::{Map, Value};

/// Checks `arguments` against `schema`; names the first property that is wrong.
///
/// # Errors
///
/// A required property missing, or a property of another type than its schema names.
pub fn check(schema: &Value, arguments: &Map<String, Value>) -> Result<(), String> {
    if let Some(Value::Array(required)) = schema.get("required") {
        for name in required.iter().filter_map(Value::as_str) {
            if !arguments.contains_key(name) {
                return Err(format!("arguments: `{name}` is required"));
            }
        }
    }
    let Some(Value::Object(properties)) = schema.get("properties") else {
        return Ok(());
    };
    for (name, value) in arguments {
        let Some(kind) = properties
            .get(name)
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str)
        else {
            continue;
        };
        let fits = match kind {
            "string" => value.is_string(),
            "number" => value.is_number(),
            "integer" => value.is_i64() || value.is_u64(),
            "boolean" => value.is_boolean(),
            "object" => value.is_object(),
            "array" => value.is_array(),
            "null" => value.is_null(),
            _ => true,
        };
        if !fits {
            return Err(format!("arguments: `{name}` must be of type {kind}"));
        }
    }
    Ok(())
}
