//! Plain greedy steps handed to the backend as one chain (`Backend::greedy_chain`): it may queue each
//! step before the host has read the token before it (the CUDA backend's chained decode graphs); every
//! token still commits through the sink.

use families::Backend;

use crate::error::RuntimeError;
use crate::session::Session;
use crate::sink::TokenSink;

/// Runs the rest of a plain greedy generation through `Backend::greedy_chain`, committing each token as
/// it arrives; false when the backend does not chain (nothing ran). The session records what the state
/// ran; a failed chain resets it (the state may be past its tokens).
pub(super) fn greedy_chain<B: Backend>(
    model: &B,
    session: &mut Session<B::State>,
    sink: &mut TokenSink<'_>,
    next: u32,
    base: usize,
) -> Result<bool, RuntimeError> {
    let budget = sink.budget_left();
    let mut ran = vec![next];
    let mut failed = None;
    let mut on_token = |t: u32| {
        ran.push(t);
        match sink.commit(t) {
            Ok(None) => true,
            Ok(Some(_)) => false,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    };
    match model.greedy_chain(next, base, &mut session.state, budget, &mut on_token) {
        Ok(Some(n)) => {
            session.tokens.extend_from_slice(&ran[..n]);
            failed.map_or(Ok(true), Err)
        }
        Ok(None) => Ok(false),
        Err(e) => {
            session.reset_all()?;
            Err(e.into())
        }
    }
}
