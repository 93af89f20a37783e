//! The OpenAI-compatible server inside your own program: open a model with the Rust front door, hand
//! it to the server's worker, and serve the routes on a listener you own (until Ctrl-C).
//!
//! ```sh
//! cargo run --release -p server --example embed -- [MODEL_DIR] [127.0.0.1:8000]
//! curl localhost:8000/v1/completions -d '{"prompt":"def f(x):","max_tokens":16}'
//! ```

use std::time::Duration;

use turbospark::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .unwrap_or_else(|| turbospark::EMBEDDED_MODEL.to_string());
    let addr = args.next().unwrap_or_else(|| "127.0.0.1:8000".into());

    // The worker thread opens the model (so loading runs on it) and serves every request on one
    // session, inside the model's thread pool.
    let queue = server::spawn(
        move || {
            let model = Model::builder(&dir).threads(2).build()?;
            let session = model.session()?;
            Ok((model, session, "embedded".to_string()))
        },
        server::WorkerOptions {
            log: true,
            ..Default::default()
        },
    )?;
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        eprintln!(
            "serving {} ({}) on http://{}",
            queue.info.name,
            queue.info.mode,
            listener.local_addr()?
        );
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        server::serve(
            listener,
            queue,
            Vec::new(),
            shutdown,
            Duration::from_secs(5),
        )
        .await
    })?;
    Ok(())
}
