//! The server's one error type, rendered as OpenAI's error object:
//! `{"error": {"message", "type", "param", "code"}}` with the matching HTTP status. Every refusal
//! names the request parameter at fault (`param`) when there is one.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use turbospark::runtime::RuntimeError;

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request parameter at fault (`temperature`, `messages[2].content`, ...).
    pub param: Option<String>,
}

impl ApiError {
    /// 400: `param` is invalid for `reason`.
    pub fn param(param: impl Into<String>, reason: impl Into<String>) -> Self {
        let param = param.into();
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!("invalid request parameter `{param}`: {}", reason.into()),
            param: Some(param),
        }
    }

    /// 400 about the request as a whole (e.g. a body that is not JSON).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    pub fn not_found(param: Option<&str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: message.into(),
            param: param.map(str::to_string),
        }
    }

    /// 405: a known route asked with another method.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: message.into(),
            param: None,
        }
    }

    /// 401: the server has an API key and the request did not carry it.
    pub fn unauthorized() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or wrong API key: send `Authorization: Bearer <key>` (--api-key)"
                .into(),
            param: None,
        }
    }

    /// 503: the queue is full; the client may retry.
    pub fn busy() -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "the server is busy: its request queue is full (--max-queue); retry later"
                .into(),
            param: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            param: None,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::METHOD_NOT_ALLOWED => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::SERVICE_UNAVAILABLE => "server_busy",
            _ => "server_error",
        }
    }

    /// The OpenAI error object.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl From<RuntimeError> for ApiError {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::InvalidRequest { field, reason } => ApiError::param(field, reason),
            // The request was valid; the model or device failed under it.
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
