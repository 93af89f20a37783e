//! Typed, error-naming access to the fields of a JSON object read from a file.
//!
//! Invariant: a field that is absent or `null` yields the caller's default (or `None`); a field that
//! is present with the wrong type is an error naming the file and the field's full dotted name
//! (e.g. `text_config.hidden_size`). `null` counts as absent because transformers' `save_pretrained`
//! writes unset optional fields as `null`.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::LoadError;

/// Reads and parses `path` as a JSON object.
pub(crate) fn read_object(
    path: &Path,
    what: &'static str,
) -> Result<Map<String, Value>, LoadError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| LoadError::from_io(path.to_path_buf(), e, what))?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(LoadError::Json {
            path: path.to_path_buf(),
            reason: format!("top level should be an object, found {}", type_name(&other)),
        }),
        Err(e) => Err(LoadError::Json {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }),
    }
}

/// A short description of a JSON value's type (and the value itself when it is short).
pub(crate) fn type_name(value: &Value) -> String {
    match value {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) if s.len() <= 40 => format!("string {s:?}"),
        Value::String(_) => "a string".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// One JSON object of a file, with the dotted prefix its fields are reported under.
#[derive(Clone, Copy)]
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
    pub object: &'a Map<String, Value>,
    /// "" for the top level, "text_config." for the text sub-config, ...
    pub prefix: &'a str,
}

impl<'a> Fields<'a> {
    pub fn new(path: &'a Path, object: &'a Map<String, Value>, prefix: &'a str) -> Self {
        Fields {
            path,
            object,
            prefix,
        }
    }

    /// The full dotted name of `field` for error messages.
    pub fn name(&self, field: &str) -> String {
        format!("{}{}", self.prefix, field)
    }

    pub fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    /// The value of `field`, `None` when absent or null.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        match self.object.get(field) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn wrong_type(&self, field: &str, expected: &'static str, found: &Value) -> LoadError {
        LoadError::WrongType {
            path: self.path_buf(),
            field: self.name(field),
            expected,
            found: type_name(found),
        }
    }

    pub fn invalid(&self, field: &str, reason: impl Into<String>) -> LoadError {
        LoadError::InvalidValue {
            path: self.path_buf(),
            field: self.name(field),
            reason: reason.into(),
        }
    }

    pub fn unsupported(&self, field: &str, reason: impl Into<String>) -> LoadError {
        LoadError::Unsupported {
            path: self.path_buf(),
            field: self.name(field),
            reason: reason.into(),
        }
    }

    pub fn missing(&self, field: &str) -> LoadError {
        LoadError::MissingField {
            path: self.path_buf(),
            field: self.name(field),
        }
    }

    /// A non-negative integer, `None` when absent.
    pub fn opt_usize(&self, field: &str) -> Result<Option<usize>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| self.wrong_type(field, "a non-negative integer", v))
    }

    pub fn usize_or(&self, field: &str, default: usize) -> Result<usize, LoadError> {
        Ok(self.opt_usize(field)?.unwrap_or(default))
    }

    pub fn usize_required(&self, field: &str) -> Result<usize, LoadError> {
        self.opt_usize(field)?.ok_or_else(|| self.missing(field))
    }

    /// A number (integer or float), `None` when absent.
    pub fn opt_f64(&self, field: &str) -> Result<Option<f64>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        v.as_f64()
            .map(Some)
            .ok_or_else(|| self.wrong_type(field, "a number", v))
    }

    pub fn opt_bool(&self, field: &str) -> Result<Option<bool>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| self.wrong_type(field, "a boolean", v))
    }

    pub fn bool_or(&self, field: &str, default: bool) -> Result<bool, LoadError> {
        Ok(self.opt_bool(field)?.unwrap_or(default))
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        v.as_str()
            .map(Some)
            .ok_or_else(|| self.wrong_type(field, "a string", v))
    }

    /// A sub-object, `None` when absent.
    pub fn opt_object(&self, field: &str) -> Result<Option<&'a Map<String, Value>>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        v.as_object()
            .map(Some)
            .ok_or_else(|| self.wrong_type(field, "an object", v))
    }

    /// A list of non-negative integers, `None` when absent.
    pub fn opt_usize_list(&self, field: &str) -> Result<Option<Vec<usize>>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        let expected = "a list of non-negative integers";
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(field, expected, v))?;
        items
            .iter()
            .map(|item| {
                item.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| self.wrong_type(field, expected, item))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A list of strings, `None` when absent.
    pub fn opt_str_list(&self, field: &str) -> Result<Option<Vec<&'a str>>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        let expected = "a list of strings";
        let items = v
            .as_array()
            .ok_or_else(|| self.wrong_type(field, expected, v))?;
        items
            .iter()
            .map(|item| {
                item.as_str()
                    .ok_or_else(|| self.wrong_type(field, expected, item))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    /// A token id: an integer in u32 range, `None` when absent.
    pub fn opt_token_id(&self, field: &str) -> Result<Option<u32>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        as_token_id(v)
            .map(Some)
            .ok_or_else(|| self.wrong_type(field, "a token id (integer < 2^32)", v))
    }

    /// Token ids given as one integer or a list of integers (transformers accepts both); empty when
    /// absent.
    pub fn token_ids(&self, field: &str) -> Result<Vec<u32>, LoadError> {
        let Some(v) = self.get(field) else {
            return Ok(Vec::new());
        };
        let expected = "a token id or a list of token ids";
        if let Some(items) = v.as_array() {
            items
                .iter()
                .map(|item| as_token_id(item).ok_or_else(|| self.wrong_type(field, expected, item)))
                .collect()
        } else {
            as_token_id(v)
                .map(|id| vec![id])
                .ok_or_else(|| self.wrong_type(field, expected, v))
        }
    }
}

fn as_token_id(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}
