//! An MTP head drafting over a reduced vocabulary (`MtpHead::with_draft_vocab`: the first N ids, -inf
//! elsewhere) proposes only those ids, and greedy speculation with it still equals sequential decoding
//! token for token (the target judges every proposal). Its sampled exactness is in
//! `sampled_distribution.rs`.

mod common;

use std::sync::{Arc, Mutex};

use common::{detok, fixture, prompt};
use drafters::{Chooser, Drafter, MtpHead};
use families::{BackendError, SharedHead, Tap};
use runtime::{generate, CancelFlag, GenerationConfig, Request, Session, Speculative};

/// Forwards to the head and keeps every proposal.
struct Recording {
    head: MtpHead,
    proposals: Arc<Mutex<Vec<u32>>>,
}

impl Drafter for Recording {
    fn name(&self) -> &'static str {
        "mtp"
    }
    fn taps(&self) -> Vec<Tap> {
        self.head.taps()
    }
    fn reset(&mut self) {
        self.head.reset()
    }
    fn position(&self) -> usize {
        self.head.position()
    }
    fn rewind(&mut self, position: usize) -> Result<(), BackendError> {
        self.head.rewind(position)
    }
    fn observe(&mut self, taps: &[Vec<f32>], n: usize, next: &[u32]) -> Result<(), BackendError> {
        self.head.observe(taps, n, next)
    }
    fn propose(
        &mut self,
        history: &[u32],
        k: usize,
        chooser: &mut dyn Chooser,
    ) -> Result<Vec<u32>, BackendError> {
        let out = self.head.propose(history, k, chooser)?;
        self.proposals.lock().unwrap().extend_from_slice(&out);
        Ok(out)
    }
}

#[test]
fn a_reduced_draft_vocabulary_proposes_only_its_ids_and_keeps_the_greedy_stream() {
    let (ck, model) = fixture("qwen3_5");
    let vocab = model.vocab;
    let draft_vocab = vocab / 2;
    let d = detok(vocab as u32);
    let head: SharedHead = model.clone();
    let proposals = Arc::new(Mutex::new(Vec::new()));
    for salt in 0..3u32 {
        let p = prompt(&model, 6 + 5 * salt as usize, salt);
        let config = GenerationConfig::greedy(32);
        let run = |drafter: Option<Box<dyn Drafter + Send>>, block: usize| {
            let mut session = Session::new(&model);
            let speculative = drafter.as_ref().map(|_| Speculative::new(block));
            if let Some(drafter) = drafter {
                session = session.with_drafter(drafter);
            }
            let req = Request {
                prompt: &p,
                config: &config,
                eos: &[],
                detok: &d,
                speculative,
                cancel: CancelFlag::new(),
            };
            generate(&*model, &mut session, &req, &mut |_| {}).unwrap()
        };
        let want = run(None, 0);
        for block in 1..=4 {
            let mtp = MtpHead::load(&ck, head.clone())
                .unwrap()
                .expect("the fixture carries an MTP head")
                .with_draft_vocab(draft_vocab);
            let drafter = Recording {
                head: mtp,
                proposals: proposals.clone(),
            };
            let got = run(Some(Box::new(drafter)), block);
            assert_eq!(got.token_ids, want.token_ids, "salt {salt} block {block}");
            assert_eq!(got.text, want.text, "salt {salt} block {block}");
            assert_eq!(got.reason, want.reason, "salt {salt} block {block}");
        }
    }
    let proposals = proposals.lock().unwrap();
    assert!(proposals.len() > 50, "only {} proposals", proposals.len());
    assert!(
        proposals.iter().all(|&t| (t as usize) < draft_vocab),
        "a proposal outside the first {draft_vocab} ids"
    );
}
