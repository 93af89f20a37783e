//! The checkpoint's own multi-token-prediction head (Qwen3.5 / Qwen3-Next `mtp.*`), as vLLM's
//! `qwen3_next_mtp.py` runs it.
//!
//! Row t of the head takes the target's hidden h_t *after its final norm* and the token x_{t+1} that
//! followed it: u = fc([pre_fc_norm_embedding(embed(x_{t+1})); pre_fc_norm_hidden(h_t)]) (2H → H), then one
//! full-attention decoder layer at rope position t with the head's own KV cache, then `mtp.norm`; the
//! shared LM head turns that into logits for x_{t+2}. Drafting k tokens chains the head on its own
//! normed output as the next h. The cache invariant: rows `0..position()` hold verified pairs; drafted
//! rows beyond it are overwritten by the next `observe`.

use crate::{Chooser, Drafter};
use families::hybrid::load_decoder_layer;
use families::layers::{Linear, Norm, Tensors};
use families::model::Layer;
use families::{BackendError, ModelError, SharedHead, State, Tap};
use model_io::{Checkpoint, LayerKind};

/// The draft vocabulary the host head uses for a target vocabulary of `vocab` ids: its first half (BPE
/// ids follow merge order, a frequency ranking) from 4096 ids up, all of a smaller one. On the testbed
/// (8192 ids) half kept the greedy acceptance exactly (2.17 accepted a round at block 3, as with all ids)
/// while a quarter lost 24% of it; on the 0.8B shape (151936 ids) the head's LM head is most of a draft
/// step, so half the rows is ~2x cheaper drafts (docs/PERFORMANCE.md).
pub fn draft_vocab(vocab: usize) -> usize {
    if vocab >= 4096 {
        vocab / 2
    } else {
        vocab
    }
}

pub struct MtpHead {
    target: SharedHead,
    fc: Linear, // [hidden, 2 * hidden]
    pre_fc_norm_embedding: Norm,
    pre_fc_norm_hidden: Norm,
    layers: Vec<Layer>,
    norm: Norm,
    state: State,
    /// Committed rows (verified pairs) in the head's cache.
    committed: usize,
    /// Normed output of the last committed row, and its logits: the first draft of the next round.
    last_hidden: Vec<f32>,
    last_logits: Vec<f32>,
    /// Tokens the draft logits cover: the first `draft_vocab` ids (the whole vocabulary by default).
    draft_vocab: usize,
}

impl MtpHead {
    /// Loads `mtp.*` from the checkpoint; `Ok(None)` when it carries no head.
    pub fn load(ck: &Checkpoint, target: SharedHead) -> Result<Option<Self>, ModelError> {
        let c = &ck.config;
        if !ck.has_mtp || c.mtp_num_hidden_layers == 0 {
            return Ok(None);
        }
        let t = Tensors::new(&ck.tensors, "mtp.");
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        let mut layers = Vec::new();
        for j in 0..c.mtp_num_hidden_layers {
            let lt = t.sub(&format!("layers.{j}."));
            let moe = c.moe.is_some() && lt.contains("mlp.gate.weight");
            layers.push(load_decoder_layer(&lt, c, LayerKind::FullAttention, moe)?);
        }
        let state = State::for_layers(&layers, "mtp".into());
        Ok(Some(MtpHead {
            fc: Linear::load(&t, "fc.weight", h, 2 * h)?,
            pre_fc_norm_embedding: Norm::load(&t, "pre_fc_norm_embedding.weight", h, eps, true)?,
            pre_fc_norm_hidden: Norm::load(&t, "pre_fc_norm_hidden.weight", h, eps, true)?,
            norm: Norm::load(&t, "norm.weight", h, eps, true)?,
            layers,
            state,
            committed: 0,
            last_hidden: Vec::new(),
            last_logits: Vec::new(),
            draft_vocab: target.vocab(),
            target,
        }))
    }

    /// Drafts over the first `tokens` ids only (clamped to the vocabulary): the head's LM head reads that
    /// many rows, and every other id gets -inf, so a greedy draft is the argmax among them and a sampled
    /// draft's q is the shaped distribution over them. The target still judges every proposal, so what is
    /// generated does not change (greedy: token for token; sampled: in distribution).
    pub fn with_draft_vocab(mut self, tokens: usize) -> Self {
        self.draft_vocab = tokens.clamp(1, self.target.vocab());
        self
    }

    /// Logits of one normed row as drafting reads them: [vocab], -inf past `draft_vocab`.
    fn draft_logits(&self, row: &[f32]) -> Vec<f32> {
        let vocab = self.target.vocab();
        if self.draft_vocab >= vocab {
            return self.target.lm_head(row, 1);
        }
        let mut logits = self.target.lm_head_prefix(row, 1, self.draft_vocab);
        logits.resize(vocab, f32::NEG_INFINITY);
        logits
    }

    /// Runs rows (hidden[j], next_tokens[j]) at positions start..start+n. Returns the normed outputs
    /// [n, hidden] and, if `logits`, the logits of the last row.
    pub fn forward(
        &mut self,
        hidden: &[f32],
        next_tokens: &[u32],
        start: usize,
        logits: bool,
    ) -> Result<(Vec<f32>, Vec<f32>), ModelError> {
        let n = next_tokens.len();
        let hd = self.target.hidden();
        if n == 0 || hidden.len() != n * hd {
            return Err(ModelError::EmptyInput);
        }
        if !self.state.rewind(start) && self.state.position() != start {
            return Err(ModelError::PositionMismatch {
                expected: self.state.position(),
                got: start,
            });
        }
        // u = fc([norm_e(embed(x_{t+1})); norm_h(h_t)])  [n, 2H] -> [n, H]
        let mut cat = vec![0.0; n * 2 * hd];
        let mut e = vec![0.0; hd];
        let mut hn = vec![0.0; hd];
        for (j, &tok) in next_tokens.iter().enumerate() {
            let row = self
                .target
                .embed_row(tok)
                .ok_or(ModelError::TokenOutOfRange {
                    token: tok,
                    index: j,
                    vocab: self.target.vocab(),
                })?;
            self.pre_fc_norm_embedding.apply(row, &mut e);
            self.pre_fc_norm_hidden
                .apply(&hidden[j * hd..(j + 1) * hd], &mut hn);
            cat[j * 2 * hd..j * 2 * hd + hd].copy_from_slice(&e);
            cat[j * 2 * hd + hd..(j + 1) * 2 * hd].copy_from_slice(&hn);
        }
        let mut x = self.fc.forward(&cat, n);
        for (i, layer) in self.layers.iter().enumerate() {
            let st = self
                .state
                .layer_mut(i)
                .ok_or_else(|| ModelError::StateMismatch("mtp".into()))?;
            layer.forward(&mut x, n, start, st, None)?;
        }
        self.state.set_position(start + n);
        self.norm.apply_inplace(&mut x);
        let lg = if logits {
            self.target.lm_head(&x[(n - 1) * hd..], 1)
        } else {
            Vec::new()
        };
        Ok((x, lg))
    }
}

impl Drafter for MtpHead {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn taps(&self) -> Vec<Tap> {
        vec![Tap::FinalHidden]
    }

    fn reset(&mut self) {
        self.state = State::for_layers(&self.layers, "mtp".into());
        self.committed = 0;
        self.last_hidden.clear();
        self.last_logits.clear();
    }

    fn position(&self) -> usize {
        self.committed
    }

    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        crate::check_rewind(self.committed, position)?;
        self.state.rewind(position);
        self.committed = position;
        // The cached first draft belonged to the old last row; the next observe recomputes it.
        self.last_logits.clear();
        self.last_hidden.clear();
        Ok(())
    }

    fn observe(
        &mut self,
        taps: &[Vec<f32>],
        n: usize,
        next_tokens: &[u32],
    ) -> Result<(), BackendError> {
        let hidden = taps.first().ok_or(ModelError::EmptyInput)?;
        let hd = self.target.hidden();
        if hidden.len() < n * hd || next_tokens.len() != n {
            return Err(ModelError::EmptyInput.into());
        }
        let (out, _) = self.forward(&hidden[..n * hd], next_tokens, self.committed, false)?;
        self.committed += n;
        self.last_hidden = out[(n - 1) * hd..].to_vec();
        self.last_logits = self.draft_logits(&self.last_hidden);
        Ok(())
    }

    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        // The head's last committed row predicts the token after history's last: valid only when observe
        // covered every row before it.
        if self.last_logits.is_empty() || self.committed + 1 != history.len() {
            return Ok(Vec::new());
        }
        let mut context = history.to_vec();
        let mut out = Vec::with_capacity(k);
        let mut logits = self.last_logits.clone();
        let mut hidden = self.last_hidden.clone();
        for i in 0..k {
            let tok = chooser.choose(&logits, &context);
            out.push(tok);
            context.push(tok);
            if i + 1 == k {
                break;
            }
            // Chain: the head's own output stands in for the target hidden of the drafted position.
            let (h, _) = self.forward(&hidden, &[tok], self.committed + i, false)?;
            logits = self.draft_logits(&h);
            hidden = h;
        }
        Ok(out)
    }
}
