//! Token ids to text, and incremental detokenization that never emits a broken code point.
//!
//! Byte-level BPE (Qwen's tokenizer) can split one multi-byte UTF-8 character over several
//! tokens; decoding a prefix that ends inside such a character yields U+FFFD at the end. The
//! [`IncrementalDecoder`] follows the two-offset scheme of Hugging Face text-generation-inference:
//! it decodes a short window `ids[prefix..]` and compares it with the decode of
//! `ids[prefix..read]`, the part already emitted; the difference is new text. A window whose
//! decode ends in U+FFFD is withheld until later tokens complete the character.
//!
//! Invariant: no delta ever ends inside a character (a delta is a `&str`, so a broken code point
//! would show up as U+FFFD), and for decoders where decoding is a concatenation of per-token pieces
//! (byte-level BPE, the fake below) the concatenation of all deltas plus [`IncrementalDecoder::flush`]
//! equals `decode(all ids)`. Windows start a few prompt tokens back so decoders that treat the
//! first token of a decode specially (SentencePiece's leading-space strip) see real context.
//!
//! Special tokens are skipped (`skip_special_tokens = true`), as llama.cpp and vLLM do for
//! streamed output: `<|im_end|>` and friends are control symbols, not text. The sink never
//! decodes a stop token anyway.

use std::collections::HashMap;

use crate::error::RuntimeError;

/// Turns token ids into text. Implemented for `tokenizers::Tokenizer` and for the test fake
/// [`ByteDetokenizer`].
pub trait Detokenizer {
    /// Decodes `ids` in one piece, skipping special tokens. Invalid UTF-8 becomes U+FFFD.
    fn decode(&self, ids: &[u32]) -> Result<String, RuntimeError>;
}

impl Detokenizer for tokenizers::Tokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, RuntimeError> {
        // The inherent `decode` lives on the `TokenizerImpl` that `Tokenizer` derefs to.
        let inner = std::ops::Deref::deref(self);
        inner
            .decode(ids, true)
            .map_err(|e| RuntimeError::Detokenize {
                count: ids.len(),
                last: ids.last().copied(),
                reason: e.to_string(),
            })
    }
}

/// A detokenizer whose every token is a chosen byte string: tests pick pieces that split
/// characters, spell stop strings across tokens, or decode to nothing (a special token).
#[derive(Debug, Clone, Default)]
pub struct ByteDetokenizer {
    pieces: HashMap<u32, Vec<u8>>,
}

impl ByteDetokenizer {
    /// Token `id` decodes to `bytes`.
    pub fn new<B: Into<Vec<u8>>>(pieces: impl IntoIterator<Item = (u32, B)>) -> Self {
        ByteDetokenizer {
            pieces: pieces.into_iter().map(|(id, b)| (id, b.into())).collect(),
        }
    }
}

impl Detokenizer for ByteDetokenizer {
    fn decode(&self, ids: &[u32]) -> Result<String, RuntimeError> {
        let mut bytes = Vec::new();
        for &id in ids {
            let piece = self.pieces.get(&id).ok_or(RuntimeError::Detokenize {
                count: ids.len(),
                last: Some(id),
                reason: format!("token {id} is not in the fake vocabulary"),
            })?;
            bytes.extend_from_slice(piece);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

/// How many prompt tokens a window starts with, as context for the first generated token
/// (text-generation-inference uses the same 5).
pub const CONTEXT_TOKENS: usize = 5;

/// Streams the text of a growing id sequence in UTF-8-safe pieces (see the module doc).
#[derive(Debug, Clone)]
pub struct IncrementalDecoder {
    /// `[context.., generated..]`: a few prompt ids, then every id pushed.
    ids: Vec<u32>,
    /// Start of the decode window.
    prefix: usize,
    /// End of what was already emitted; `ids[prefix..read]` is the window's known text.
    read: usize,
}

impl IncrementalDecoder {
    /// A decoder whose first window starts with the last [`CONTEXT_TOKENS`] of `prompt`. A context
    /// that itself ends inside a character is dropped: its completion would rewrite text the
    /// caller never saw as a delta.
    pub fn new(prompt: &[u32], detok: &dyn Detokenizer) -> Result<Self, RuntimeError> {
        let start = prompt.len().saturating_sub(CONTEXT_TOKENS);
        let mut context = prompt.get(start..).unwrap_or_default().to_vec();
        if detok
            .decode(&context)?
            .ends_with(char::REPLACEMENT_CHARACTER)
        {
            context.clear();
        }
        let read = context.len();
        Ok(IncrementalDecoder {
            ids: context,
            prefix: 0,
            read,
        })
    }

    /// Appends `id` and returns the text that became certain (possibly empty: a partial
    /// character, or a token that decodes to nothing).
    pub fn push(&mut self, id: u32, detok: &dyn Detokenizer) -> Result<String, RuntimeError> {
        self.ids.push(id);
        let (known, window) = self.decode_window(detok)?;
        if window.ends_with(char::REPLACEMENT_CHARACTER) {
            return Ok(String::new());
        }
        match window.strip_prefix(known.as_str()) {
            // An empty delta leaves the window open, as TGI does, so a token that decodes to
            // nothing on its own still has its neighbours as context.
            Some(delta) if !delta.is_empty() => {
                let delta = delta.to_string();
                self.prefix = self.read;
                self.read = self.ids.len();
                Ok(delta)
            }
            // `None`: this decoder rewrote earlier text given later tokens; wait for a window that
            // extends what was emitted (or for `flush`).
            _ => Ok(String::new()),
        }
    }

    /// Returns every withheld piece of text, even a trailing U+FFFD that can no longer be
    /// completed, and closes the window. Called once the sequence has ended.
    pub fn flush(&mut self, detok: &dyn Detokenizer) -> Result<String, RuntimeError> {
        let (known, window) = self.decode_window(detok)?;
        // Text already emitted cannot be retracted. If this decoder rewrote it given later tokens,
        // skip as many bytes as were emitted (best effort; byte-level BPE never takes this path).
        let rest = window
            .strip_prefix(known.as_str())
            .or_else(|| window.get(known.len()..))
            .unwrap_or_default();
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(rest.to_string())
    }

    /// `(decode(ids[prefix..read]), decode(ids[prefix..]))`.
    fn decode_window(&self, detok: &dyn Detokenizer) -> Result<(String, String), RuntimeError> {
        let known = detok.decode(self.ids.get(self.prefix..self.read).unwrap_or_default())?;
        let window = detok.decode(self.ids.get(self.prefix..).unwrap_or_default())?;
        Ok((known, window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per byte 0..=255 (token id = byte value).
    fn byte_vocab() -> ByteDetokenizer {
        ByteDetokenizer::new((0u32..256).map(|b| (b, vec![b as u8])))
    }

    fn stream(ids: &[u32], prompt: &[u32], detok: &dyn Detokenizer) -> Vec<String> {
        let mut decoder = IncrementalDecoder::new(prompt, detok).unwrap();
        let mut deltas: Vec<String> = ids
            .iter()
            .map(|&id| decoder.push(id, detok).unwrap())
            .collect();
        deltas.push(decoder.flush(detok).unwrap());
        deltas
    }

    #[test]
    fn multibyte_characters_split_into_single_byte_tokens_are_emitted_whole() {
        let detok = byte_vocab();
        let text = "aé😀b";
        let ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let deltas = stream(&ids, &[u32::from(b'x')], &detok);
        // Bytes: a | C3 A9 | F0 9F 98 80 | b: é completes on its 2nd byte, 😀 on its 4th.
        assert_eq!(deltas, ["a", "", "é", "", "", "", "😀", "b", ""]);
        assert_eq!(deltas.concat(), text);
    }

    #[test]
    fn random_byte_splits_concatenate_to_the_full_decode() {
        let text = "Grüße, 世界! 🎉🎉 naïve café — ok";
        let bytes = text.as_bytes();
        // Tokens are random-length byte runs (LCG-chosen 1..=3 bytes), so boundaries fall inside
        // characters at many offsets.
        let mut state = 12345u64;
        let mut pieces = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let len = (1 + (state >> 33) % 3) as usize;
            let end = (at + len).min(bytes.len());
            pieces.push(bytes[at..end].to_vec());
            at = end;
        }
        let detok = ByteDetokenizer::new(
            pieces
                .iter()
                .enumerate()
                .map(|(i, p)| (i as u32, p.clone())),
        );
        let ids: Vec<u32> = (0..pieces.len() as u32).collect();
        let deltas = stream(&ids, &[], &detok);
        for d in &deltas {
            assert!(
                !d.contains(char::REPLACEMENT_CHARACTER),
                "broken delta {d:?}"
            );
        }
        assert_eq!(deltas.concat(), text);
        assert_eq!(deltas.concat(), detok.decode(&ids).unwrap());
    }

    #[test]
    fn an_incomplete_tail_is_flushed_as_replacement_at_the_end() {
        let detok = byte_vocab();
        // "a" then the first byte of "é" and nothing to complete it.
        let deltas = stream(&[0x61, 0xC3], &[], &detok);
        assert_eq!(deltas, ["a", "", "\u{FFFD}"]);
    }

    #[test]
    fn an_invalid_byte_followed_by_text_is_released_with_it() {
        let detok = byte_vocab();
        // A lone continuation byte can never complete: it is emitted once text follows it.
        let deltas = stream(&[0xA9, 0x41], &[], &detok);
        assert_eq!(deltas.concat(), "\u{FFFD}A");
        assert_eq!(deltas[0], "");
    }

    #[test]
    fn a_prompt_ending_inside_a_character_is_not_used_as_context() {
        let detok = byte_vocab();
        // Prompt ends with C3 (first half of é); generation supplies A9 then 'z'. With the prompt as
        // context the window would decode to "é" and rewrite prompt text; without it the A9 alone is
        // invalid and comes out as U+FFFD, followed by z.
        let deltas = stream(&[0xA9, 0x7A], &[0x61, 0xC3], &detok);
        assert_eq!(deltas.concat(), "\u{FFFD}z");
    }

    #[test]
    fn the_prompt_context_is_not_emitted() {
        let detok = byte_vocab();
        let prompt: Vec<u32> = "hello world".bytes().map(u32::from).collect();
        let deltas = stream(&[0x21], &prompt, &detok);
        assert_eq!(deltas.concat(), "!");
    }

    #[test]
    fn unknown_ids_are_errors_naming_the_id() {
        let detok = byte_vocab();
        let err = detok.decode(&[1, 999]).unwrap_err();
        assert!(err.to_string().contains("999"), "{err}");
    }

    #[test]
    fn tokenizer_decode_skips_special_tokens() {
        let json = r#"{
            "version": "1.0",
            "added_tokens": [{"id": 2, "content": "<eos>", "single_word": false, "lstrip": false,
                              "rstrip": false, "normalized": false, "special": true}],
            "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": {"a": 0, "b": 1, "<eos>": 2}, "unk_token": "a"}
        }"#;
        let tokenizer: tokenizers::Tokenizer = json.parse().unwrap();
        let text = Detokenizer::decode(&tokenizer, &[0, 2, 1]).unwrap();
        assert!(!text.contains("<eos>"), "{text:?}");
        assert_eq!(text.replace(' ', ""), "ab");
    }
}
