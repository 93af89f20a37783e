//! The API's `logprobs`: the runtime's per-token entries (`turbospark::runtime::TokenLogprob`: ln p of the raw
//! distribution and its top n) rendered with token text, in OpenAI's two shapes — the completions API's
//! `{tokens, token_logprobs, top_logprobs, text_offset}` and the chat API's `{content: [{token, logprob,
//! bytes, top_logprobs}]}`.
//!
//! A token's bytes are its own piece of the vocabulary: for byte-level BPE tokenizers (Qwen's) the
//! vocabulary string mapped back through GPT-2's byte <-> character table, so a token holding half of a
//! UTF-8 character reports its real bytes (its `token` string is those bytes decoded lossily, as vLLM
//! shows them); other tokenizers decode the id alone. `text_offset` counts characters of the token strings
//! before each token, so it is exact unless a character is split across tokens.

use serde_json::{json, Map, Value};
use tokenizers::{DecoderWrapper, Tokenizer};
use turbospark::runtime::TokenLogprob;

/// One token as the API shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct Shown {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// One generated token's entry, rendered.
#[derive(Clone, Debug, PartialEq)]
pub struct Rendered {
    pub chosen: Shown,
    pub top: Vec<Shown>,
    /// Characters of the completion's token strings before this token (`text_offset`).
    pub offset: usize,
    /// False for an echoed prompt's first token, which nothing judged (`null` in the API).
    pub scored: bool,
}

/// Renders entries in order, continuing the character count from `offset`.
pub struct Renderer<'a> {
    tokenizer: &'a Tokenizer,
    /// GPT-2's byte-level alphabet reversed (character -> byte), when the tokenizer decodes byte-level.
    byte_level: Option<std::collections::HashMap<char, u8>>,
    offset: usize,
}

/// GPT-2's bytes_to_unicode, reversed: printable bytes stand for themselves, the other 68 bytes take
/// the characters from U+0100 on, in byte order.
fn byte_level_alphabet() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                char::from(b)
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap_or(char::REPLACEMENT_CHARACTER)
            };
            (c, b)
        })
        .collect()
}

impl<'a> Renderer<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> Self {
        let byte_level = matches!(tokenizer.get_decoder(), Some(DecoderWrapper::ByteLevel(_)))
            .then(byte_level_alphabet);
        Renderer {
            tokenizer,
            byte_level,
            offset: 0,
        }
    }

    fn show(&self, id: u32, logprob: f32) -> Shown {
        let piece = self.tokenizer.id_to_token(id);
        let bytes = match (&self.byte_level, &piece) {
            (Some(table), Some(p)) => p
                .chars()
                .map(|c| table.get(&c).copied())
                .collect::<Option<Vec<u8>>>()
                // Added tokens are stored as text (e.g. "<|im_end|>"), not byte-level characters.
                .unwrap_or_else(|| p.as_bytes().to_vec()),
            _ => self
                .tokenizer
                .decode(&[id], false)
                .map(String::into_bytes)
                .unwrap_or_else(|_| piece.unwrap_or_default().into_bytes()),
        };
        Shown {
            token: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
            logprob,
        }
    }

    pub fn render(&mut self, e: &TokenLogprob) -> Rendered {
        let chosen = self.show(e.token, e.logprob);
        let offset = self.offset;
        self.offset += chosen.token.chars().count();
        Rendered {
            top: e.top.iter().map(|&(id, lp)| self.show(id, lp)).collect(),
            chosen,
            offset,
            scored: true,
        }
    }

    /// An echoed prompt's first token: shown, not scored.
    pub fn render_unscored(&mut self, token: u32) -> Rendered {
        let chosen = self.show(token, f32::NAN);
        let offset = self.offset;
        self.offset += chosen.token.chars().count();
        Rendered {
            chosen,
            top: Vec::new(),
            offset,
            scored: false,
        }
    }
}

/// A log-probability as JSON: a number, or OpenAI's stand-in for minus infinity (JSON has none).
fn number(lp: f32) -> Value {
    match lp.is_finite() {
        true => json!(lp),
        false => json!(-9999.0),
    }
}

/// The completions API's `logprobs` object over `entries`.
pub fn completion_json(entries: &[Rendered]) -> Value {
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            if !e.scored {
                return Value::Null;
            }
            let mut m = Map::new();
            for s in &e.top {
                // Two ids can show the same string: keep the first (more likely) one.
                m.entry(s.token.clone())
                    .or_insert_with(|| number(s.logprob));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": entries.iter().map(|e| e.chosen.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": entries
            .iter()
            .map(|e| if e.scored { number(e.chosen.logprob) } else { Value::Null })
            .collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": entries.iter().map(|e| e.offset).collect::<Vec<_>>(),
    })
}

/// The chat API's `logprobs` object over `entries`.
pub fn chat_json(entries: &[Rendered]) -> Value {
    let shown =
        |s: &Shown| json!({"token": s.token, "logprob": number(s.logprob), "bytes": s.bytes});
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = shown(&e.chosen);
            v["top_logprobs"] = e.top.iter().map(shown).collect::<Vec<_>>().into();
            v
        })
        .collect();
    json!({"content": content, "refusal": null})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_alphabet_is_a_bijection_with_gpt2s_known_points() {
        let t = byte_level_alphabet();
        assert_eq!(t.len(), 256);
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
        let mut bytes: Vec<u8> = t.values().copied().collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
    }
}
