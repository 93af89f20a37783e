//! `turbospark serve`: the OpenAI-compatible HTTP server (the `server` crate) on one model.
//!
//! Loads the model on its worker thread (a named `--speculative N` that cannot be served is refused
//! before the load, as in `generate`), binds, prints one `listening on http://HOST:PORT` line on
//! stderr, and serves until Ctrl-C; requests in flight then get a few seconds to finish.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use turbospark::runtime::{DrafterRequest, Speculation};

use crate::ModelArgs;

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model name clients send (`model`); default: the checkpoint directory's name.
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Requests that may wait for the model; more are refused with 503.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_queue: usize,
    /// Requests generated at once (CPU: continuous batching, each request's output what it would be
    /// alone; default 8). On the GPU requests run one at a time.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub parallel: Option<u32>,
    /// Seconds a streaming client may go without reading before its request is cancelled (the
    /// server goes on with the others).
    #[arg(long, value_name = "SECS", default_value_t = 30.0, value_parser = parse_timeout)]
    pub stalled_client_timeout: f64,
    /// Speculative decoding for every request: auto, off, or N proposals per round.
    #[arg(long, value_name = "auto|off|N", default_value = "auto", value_parser = crate::generate::parse_speculation)]
    pub speculative: Speculation,
    /// Which drafter speculative decoding uses: auto (the checkpoint's MTP head, else its DFlash
    /// drafter, else the suffix drafter), mtp, dflash, ngram (prompt lookup: copies from the context,
    /// needs no weights), or suffix (the most frequent continuation in this and earlier requests of the same API key;
    /// needs no weights).
    #[arg(long, value_name = "auto|mtp|dflash|ngram|suffix", default_value = "auto", value_parser = crate::generate::parse_drafter)]
    pub drafter: DrafterRequest,
    #[command(flatten)]
    pub drafter_options: crate::generate::DrafterOptionArgs,
    /// Require `Authorization: Bearer KEY` on the /v1 routes; several keys, comma-separated (or the
    /// flag repeated), are several clients: the suffix drafter shares what it learns from one
    /// request only with later requests of the same key (with no key, with none).
    #[arg(
        long,
        value_name = "KEY",
        env = "TURBOSPARK_API_KEY",
        value_delimiter = ','
    )]
    pub api_key: Vec<String>,
    /// No per-request log lines on stderr.
    #[arg(long)]
    pub quiet: bool,
}

fn parse_timeout(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Ok(s),
        _ => Err(format!("expected seconds in (0, 86400] (got {value:?})")),
    }
}

pub fn run(args: &ServeArgs) -> Result<()> {
    if args.model.threads == Some(0) {
        bail!("invalid value 0 for --threads: at least one thread is needed");
    }
    let dir = args.model.model_dir()?;
    let name = match &args.served_model_name {
        Some(name) => name.clone(),
        None => dir
            .file_name()
            .map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned()),
    };
    let (device, speculative, drafter) = (args.model.device, args.speculative, args.drafter);
    let drafter_options = args.drafter_options.options()?;
    if args.api_key.iter().any(|k| k.is_empty()) {
        bail!("invalid value for --api-key: a key is empty");
    }
    let threads = args.model.threads;
    // Requests at once: the flag, else 8 (a model that does not batch, on the GPU, serves one at a
    // time whatever is asked: server::spawn).
    let parallel = args.parallel.map_or(8, |n| n as usize);
    let spinner = crate::progress::spinner(format!("loading {}", dir.display()));
    let load_dir = dir.clone();
    let quantize = args.model.quantize;
    let queue = server::spawn(
        move || {
            let mut builder = turbospark::Model::builder(&load_dir)
                .device(device)
                .speculation(speculative)
                .drafter(drafter)
                .drafter_options(drafter_options)
                .quantize(quantize)
                .batching(parallel > 1);
            if let Some(threads) = threads {
                builder = builder.threads(threads);
            }
            let model = builder.build()?;
            crate::note_fallback(device, model.device_note());
            if parallel > 1 && !model.batches() {
                eprintln!("note: --parallel {parallel}: on {} requests run one at a time (batching is CPU-only)", model.device_name());
            }
            let session = model.session()?;
            if let Some(warning) = session.warning() {
                eprintln!("warning: {warning}");
            }
            Ok((model, session, name))
        },
        server::WorkerOptions {
            max_queue: args.max_queue,
            log: !args.quiet,
            stalled_client: Duration::from_secs_f64(args.stalled_client_timeout),
            parallel,
        },
    );
    spinner.finish_and_clear();
    let queue = queue.map_err(|e| crate::open_error(e, device))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the server's runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("--host {} --port {}: cannot listen", args.host, args.port))?;
        let addr = listener.local_addr().context("reading the bound address")?;
        // Ctrl-C or SIGTERM (what service managers and container runtimes send): stop accepting,
        // give requests in flight 5 s, then exit. The handlers are installed before the address is
        // printed, so a signal sent as soon as the server answers is never the default (killing) one.
        #[cfg(unix)]
        let signals = {
            use tokio::signal::unix::{signal, SignalKind};
            (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
        };
        let shutdown = async move {
            #[cfg(unix)]
            match signals {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
            #[cfg(not(unix))]
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("shutting down");
        };
        eprintln!(
            "serving {} ({}, {}, context {}) on http://{addr} (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics)",
            queue.info.name, queue.info.device, queue.info.mode, queue.info.context
        );
        eprintln!("listening on http://{addr}");
        server::serve(
            listener,
            queue,
            args.api_key.clone(),
            shutdown,
            Duration::from_secs(5),
        )
            .await
            .context("serving")
    })
}
