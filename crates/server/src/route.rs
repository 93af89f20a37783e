//! Which worker takes a job. A job of an API key goes to the worker that served that key last when that
//! worker is idle: its session holds the key's prefix (the next turn prefills only what is new) and its
//! suffix drafter the key's earlier requests (a repeated prompt is copied). Otherwise the job goes to an
//! idle worker that holds no key's memory, else to the one idle longest (whose key is the least
//! recent), or, with none idle, waits in arrival order (at most `max_queue` jobs) for the next worker
//! that finishes. Measured: with `--parallel 8` a key's repeated requests used to land
//! on other workers and ran at 0.85-0.91x llama.cpp's ngram-mod instead of 1.31-1.34x
//! (`tools/bench/vs_llama_ngram.py --warm`).
//!
//! Invariant: a job is in exactly one place (a worker's inbox, the waiting queue, or taken), and a
//! worker is in `idle` only while it waits with an empty inbox, so no job waits while a worker idles.

use std::collections::{HashMap, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

use crate::worker::Job;

/// Why a job was not taken.
pub(crate) enum Refused {
    /// `max_queue` jobs wait already.
    Full,
    /// The server is shutting down.
    Closed,
}

struct State {
    /// Idle workers, the most recently idle last.
    idle: Vec<usize>,
    /// A job handed to each worker.
    inbox: Vec<Option<Job>>,
    waiting: VecDeque<Job>,
    /// The worker that last took each client's job.
    last: HashMap<usize, usize>,
    /// The client whose job each worker took last (None: a keyless job, or none yet).
    owner: Vec<Option<usize>>,
    closed: bool,
}

pub(crate) struct Router {
    state: Mutex<State>,
    wake: Condvar,
    max_queue: usize,
}

impl Router {
    pub(crate) fn new(workers: usize, max_queue: usize) -> Self {
        Router {
            state: Mutex::new(State {
                idle: Vec::new(),
                inbox: (0..workers.max(1)).map(|_| None).collect(),
                waiting: VecDeque::new(),
                last: HashMap::new(),
                owner: vec![None; workers.max(1)],
                closed: false,
            }),
            wake: Condvar::new(),
            max_queue,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `job` to a worker or queues it (see the module doc).
    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refused::Closed);
        }
        let preferred = job
            .client
            .and_then(|c| s.last.get(&c.0).copied())
            .filter(|w| s.idle.contains(w));
        let unowned = s.idle.iter().rev().copied().find(|&w| s.owner[w].is_none());
        match preferred.or(unowned).or_else(|| s.idle.first().copied()) {
            Some(w) => {
                s.idle.retain(|&i| i != w);
                s.inbox[w] = Some(job);
                self.wake.notify_all();
                Ok(())
            }
            None if s.waiting.len() < self.max_queue => {
                s.waiting.push_back(job);
                Ok(())
            }
            None => Err(Refused::Full),
        }
    }

    /// Worker `w`'s next job: one handed to it, else the oldest waiting, else it idles until one comes;
    /// `None` once the router is closed.
    pub(crate) fn next(&self, w: usize) -> Option<Job> {
        let mut s = self.lock();
        loop {
            let job = s.inbox[w].take().or_else(|| s.waiting.pop_front());
            if let Some(job) = job {
                let client = job.client.map(|c| c.0);
                if let Some(c) = client {
                    s.last.insert(c, w);
                }
                s.owner[w] = client;
                return Some(job);
            }
            if s.closed {
                return None;
            }
            if !s.idle.contains(&w) {
                s.idle.push(w);
            }
            s = self.wake.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Stops the workers once their current jobs end; jobs still waiting are dropped (their clients
    /// see the stream end).
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        s.closed = true;
        s.waiting.clear();
        self.wake.notify_all();
    }
}
