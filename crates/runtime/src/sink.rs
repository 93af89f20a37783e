//! The generation contract: every token a decode loop commits, sequential or speculative, goes
//! through [`TokenSink::commit`], and callers observe only what the sink emits.
//!
//! On each committed token the checks run in this order, and the first that fires ends the run:
//!
//! 1. **cancellation** — polled once per commit (and once per prefill chunk through
//!    [`TokenSink::poll_prefill`]). The token being committed is dropped: not in `history`, not
//!    counted, no text.
//! 2. **stop token** — the model's EOS list plus the request's stop ids. As in vLLM, the stop token
//!    is committed and counted (in `history`, `generated`, `token_ids`, so against `max_tokens`)
//!    but never decoded: it contributes no text.
//! 3. **stop string** — matched on the decoded text, across token boundaries and inside
//!    multi-byte characters (matching runs on whole characters from the [`IncrementalDecoder`]).
//!    The first stop string to complete wins; among several completing on the same token, the one
//!    starting earliest, then the lowest index. The match and everything after it is never
//!    emitted.
//! 4. **max tokens**, then **context full** (`history.len() == context_len`: no token can follow).
//!
//! Streaming invariant: text that could still be the beginning of a stop string is withheld until
//! it is disambiguated; a delta is always whole characters; the concatenation of all
//! [`Event::Delta`]s equals the final `text`. At an end that is not a stop string (cancel, stop
//! token, max tokens, context full) the withheld tail is flushed: nothing can follow it, so it can
//! no longer become a stop string, and it is text the model did produce.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::config::GenerationConfig;
use crate::detok::{Detokenizer, IncrementalDecoder};
use crate::error::RuntimeError;
use crate::logprobs::TokenLogprob;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The caller's [`CancelFlag`] was set.
    Cancelled,
    /// This stop token (EOS or a user stop id) was committed.
    StopToken(u32),
    /// Stop string at this index of `GenerationConfig::stop_strings` appeared in the text.
    StopString(usize),
    /// `max_new_tokens` tokens were committed.
    MaxTokens,
    /// The context window is full.
    ContextFull,
}

impl StopReason {
    /// The OpenAI `finish_reason`: "stop" for stop tokens and strings, "length" for the budget or
    /// the context, "cancelled" for a cancel (the server normally has no client left to tell).
    pub fn finish_reason(&self) -> &'static str {
        match self {
            StopReason::StopToken(_) | StopReason::StopString(_) => "stop",
            StopReason::MaxTokens | StopReason::ContextFull => "length",
            StopReason::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Cancelled => write!(f, "cancelled"),
            StopReason::StopToken(id) => write!(f, "stop token {id}"),
            StopReason::StopString(i) => write!(f, "stop string {i}"),
            StopReason::MaxTokens => write!(f, "max tokens"),
            StopReason::ContextFull => write!(f, "context full"),
        }
    }
}

/// What a generation reports while it runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event<'a> {
    /// New text: whole characters, never part of a stop string.
    Delta(&'a str),
    /// Prefill progress: `done` of `total` prompt tokens are in the model state.
    Prefill { done: usize, total: usize },
    /// A token was committed; `generated` tokens so far.
    Decode { generated: usize },
    /// The log-probability entry of the token just committed (requests that ask for them), sent
    /// before that token's text.
    Logprob(&'a TokenLogprob),
}

/// A cancellation request shared between a front end and a running generation. Cloning shares
/// the flag; setting it is visible to every clone.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag(Arc<AtomicBool>);

impl CancelFlag {
    /// A flag that is not set.
    pub fn new() -> Self {
        CancelFlag::default()
    }

    /// Asks the generation to stop at its next poll.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the sink hands back when the generation is over.
#[derive(Debug, Clone, PartialEq)]
pub struct SinkOutput {
    pub reason: StopReason,
    /// Prompt + committed ids.
    pub history: Vec<u32>,
    pub prompt_len: usize,
    /// The committed ids (a stop token included).
    pub token_ids: Vec<u32>,
    /// The emitted text: the concatenation of every delta.
    pub text: String,
    /// One entry per committed id when every commit carried one (`commit_scored`), else empty.
    pub logprobs: Vec<TokenLogprob>,
}

/// The one commit path of every decode loop (see the module doc for the rules).
pub struct TokenSink<'a> {
    detok: &'a dyn Detokenizer,
    cancel: CancelFlag,
    on_event: &'a mut dyn FnMut(Event<'_>),
    stop_ids: Vec<u32>,
    stop_strings: Vec<String>,
    /// Length of the longest stop string in bytes: how far back a partial match can start.
    longest_stop: usize,
    max_new_tokens: usize,
    context_len: usize,
    /// Prompt, then every committed id.
    history: Vec<u32>,
    prompt_len: usize,
    decoder: IncrementalDecoder,
    /// Whole-character text of the committed tokens; `text[emitted..]` is withheld.
    text: String,
    emitted: usize,
    stopped: Option<StopReason>,
    /// The entries `commit_scored` was given, one per committed id.
    logprobs: Vec<TokenLogprob>,
}

impl<'a> TokenSink<'a> {
    /// A sink for a generation continuing `prompt`. `eos_ids` is the model's EOS list
    /// (`generation_config.json`); the request's own stop ids come from `config`.
    pub fn new(
        prompt: &[u32],
        config: &GenerationConfig,
        eos_ids: &[u32],
        context_len: usize,
        detok: &'a dyn Detokenizer,
        cancel: CancelFlag,
        on_event: &'a mut dyn FnMut(Event<'_>),
    ) -> Result<Self, RuntimeError> {
        let mut stop_ids: Vec<u32> = eos_ids.to_vec();
        stop_ids.extend_from_slice(&config.stop_token_ids);
        Ok(TokenSink {
            decoder: IncrementalDecoder::new(prompt, detok)?,
            detok,
            cancel,
            on_event,
            stop_ids,
            longest_stop: config
                .stop_strings
                .iter()
                .map(String::len)
                .max()
                .unwrap_or(0),
            stop_strings: config.stop_strings.clone(),
            max_new_tokens: config.max_new_tokens,
            context_len,
            history: prompt.to_vec(),
            prompt_len: prompt.len(),
            text: String::new(),
            emitted: 0,
            stopped: None,
            logprobs: Vec::new(),
        })
    }

    /// Commits one token and applies the stop rules in their order of precedence. Returns the
    /// reason when this token ended the generation. Committing after a stop is an error.
    pub fn commit(&mut self, token: u32) -> Result<Option<StopReason>, RuntimeError> {
        self.commit_scored(token, None)
    }

    /// [`commit`](Self::commit) with the token's log-probability entry, which is kept (and sent as
    /// `Event::Logprob` before the token's text) when the token is committed.
    pub fn commit_scored(
        &mut self,
        token: u32,
        logprob: Option<TokenLogprob>,
    ) -> Result<Option<StopReason>, RuntimeError> {
        if let Some(reason) = self.stopped {
            return Err(RuntimeError::CommitAfterStop { token, reason });
        }
        if self.cancel.is_cancelled() {
            return self.stop(StopReason::Cancelled).map(Some);
        }
        self.history.push(token);
        if let Some(entry) = logprob {
            (self.on_event)(Event::Logprob(&entry));
            self.logprobs.push(entry);
        }
        let reason = if self.stop_ids.contains(&token) {
            Some(StopReason::StopToken(token))
        } else {
            let piece = self.decoder.push(token, self.detok)?;
            self.text.push_str(&piece);
            if let Some((index, start)) = find_stop(&self.text, self.emitted, &self.stop_strings) {
                self.text.truncate(start);
                Some(StopReason::StopString(index))
            } else if self.generated() >= self.max_new_tokens {
                Some(StopReason::MaxTokens)
            } else if self.history.len() >= self.context_len {
                Some(StopReason::ContextFull)
            } else {
                None
            }
        };
        match reason {
            None => {
                let hold = hold_start(
                    &self.text,
                    self.emitted,
                    &self.stop_strings,
                    self.longest_stop,
                );
                self.emit_until(hold);
            }
            Some(reason) => {
                self.stop(reason)?;
            }
        }
        let generated = self.generated();
        (self.on_event)(Event::Decode { generated });
        Ok(reason)
    }

    /// Reports prefill progress and polls the cancel flag; loops call it once per prefill chunk.
    /// Returns `Some(Cancelled)` (and the sink is stopped) when the flag is set.
    pub fn poll_prefill(
        &mut self,
        done: usize,
        total: usize,
    ) -> Result<Option<StopReason>, RuntimeError> {
        (self.on_event)(Event::Prefill { done, total });
        if self.stopped.is_none() && self.cancel.is_cancelled() {
            return self.stop(StopReason::Cancelled).map(Some);
        }
        Ok(self.stopped)
    }

    /// Ends the generation for `reason` (e.g. a loop that ran out of context on its own). A stop
    /// string end emits the text before the match; any other end flushes the withheld text. A
    /// sink that already stopped keeps its first reason, which is returned.
    pub fn stop(&mut self, reason: StopReason) -> Result<StopReason, RuntimeError> {
        if let Some(first) = self.stopped {
            return Ok(first);
        }
        if !matches!(reason, StopReason::StopString(_)) {
            let rest = self.decoder.flush(self.detok)?;
            self.text.push_str(&rest);
        }
        self.emit_until(self.text.len());
        self.stopped = Some(reason);
        Ok(reason)
    }

    /// The output of a stopped sink.
    pub fn finish(self) -> Result<SinkOutput, RuntimeError> {
        let reason = self.stopped.ok_or(RuntimeError::NotStopped)?;
        let token_ids = self.generated_ids().to_vec();
        Ok(SinkOutput {
            reason,
            prompt_len: self.prompt_len,
            token_ids,
            text: self.text,
            history: self.history,
            logprobs: self.logprobs,
        })
    }

    /// Prompt + committed ids: what the next forward pass continues and what penalties read.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    pub fn prompt_len(&self) -> usize {
        self.prompt_len
    }

    /// Tokens committed so far (a stop token included).
    pub fn generated(&self) -> usize {
        self.history.len() - self.prompt_len
    }

    pub fn generated_ids(&self) -> &[u32] {
        self.history.get(self.prompt_len..).unwrap_or_default()
    }

    /// The history as the sampling crate reads it (the prompt, reused prefix included, is not
    /// "generated").
    pub fn shaping_history(&self) -> Result<sampling::History<'_>, RuntimeError> {
        Ok(sampling::History::new(&self.history, self.generated())?)
    }

    /// How many more tokens may be committed before max tokens or the context ends the run; a
    /// speculative round proposes at most this many.
    pub fn budget_left(&self) -> usize {
        let tokens = self.max_new_tokens.saturating_sub(self.generated());
        let context = self.context_len.saturating_sub(self.history.len());
        tokens.min(context)
    }

    /// Text emitted so far.
    pub fn text(&self) -> &str {
        self.text.get(..self.emitted).unwrap_or_default()
    }

    /// `Some` once the generation has stopped.
    pub fn stopped(&self) -> Option<StopReason> {
        self.stopped
    }

    pub fn cancel_flag(&self) -> &CancelFlag {
        &self.cancel
    }

    /// Emits `text[emitted..end]` as one delta. `end` is a character boundary by construction
    /// (a match start, a hold start or the end of the text).
    fn emit_until(&mut self, end: usize) {
        if end <= self.emitted {
            return;
        }
        if let Some(delta) = self.text.get(self.emitted..end) {
            (self.on_event)(Event::Delta(delta));
            self.emitted = end;
        }
    }
}

/// The stop string match in `text[from..]` that wins (earliest start, then lowest index), as
/// `(index, start)`. Matches can only start at `from` or later: text before `from` was released,
/// which means no stop string could start there.
fn find_stop(text: &str, from: usize, stops: &[String]) -> Option<(usize, usize)> {
    let tail = text.get(from..)?;
    stops
        .iter()
        .enumerate()
        .filter_map(|(index, stop)| tail.find(stop.as_str()).map(|at| (index, from + at)))
        .min_by_key(|&(index, start)| (start, index))
}

/// Where the withheld tail of `text` starts: the earliest character boundary at or after `from`
/// whose suffix is a (proper) prefix of some stop string, or `text.len()` if none is. Only the
/// last `longest - 1` bytes can start such a suffix.
fn hold_start(text: &str, from: usize, stops: &[String], longest: usize) -> usize {
    let lower = from.max(text.len().saturating_sub(longest.saturating_sub(1)));
    (lower..text.len())
        .filter(|&b| text.is_char_boundary(b))
        .find(|&b| {
            let suffix = text.get(b..).unwrap_or_default();
            stops.iter().any(|stop| stop.starts_with(suffix))
        })
        .unwrap_or(text.len())
}

#[cfg(test)]
#[path = "sink_tests.rs"]
mod tests;
