//! `turbospark serve` as a user runs it: the binary binds, says where, answers HTTP with
//! transformers' greedy continuation of the real-tokenizer fixture (reference.json, independent of our
//! code), refuses what it cannot serve before binding, and exits cleanly on Ctrl-C.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{json, Value};

fn fixture(name: &str) -> String {
    testdata::fixture(name).display().to_string()
}

fn serve(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_turbospark"));
    cmd.arg("serve")
        .args(args)
        .env_remove("TURBOSPARK_MODEL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A running server: its address, and its stderr lines after the `listening on` one.
struct Running {
    child: Child,
    addr: String,
    rest: mpsc::Receiver<String>,
}

impl Drop for Running {
    /// A test that fails midway leaves no server behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(args: &[&str]) -> Running {
    let mut child = serve(args).spawn().expect("spawn turbospark serve");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut running = Running {
        child,
        addr: String::new(),
        rest: rx,
    };
    let mut seen = Vec::new();
    while running.addr.is_empty() {
        let line = running
            .rest
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|_| panic!("no `listening on` line; stderr: {seen:?}"));
        match line.strip_prefix("listening on http://") {
            Some(addr) => running.addr = addr.to_string(),
            None => seen.push(line),
        }
    }
    running
}

/// One HTTP/1.1 exchange: (status code, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let mut tcp = TcpStream::connect(addr).unwrap();
    write!(
        tcp,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    tcp.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let at = reply.find("\r\n\r\n").unwrap() + 4;
    (status, reply[at..].to_string())
}

fn realtok_reference() -> (String, String) {
    let dir = PathBuf::from(fixture("qwen3_realtok"));
    let json = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let json: Value = serde_json::from_str(&json).unwrap();
    let ids: Vec<u32> = json["greedy_ids"].as_array().unwrap()[..8]
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let tokenizer = turbospark::model_io::Checkpoint::open(&dir)
        .unwrap()
        .tokenizer()
        .unwrap();
    let text = tokenizer.decode(&ids, true).unwrap();
    (json["prompt_text"].as_str().unwrap().to_string(), text)
}

#[test]
fn serve_answers_with_transformers_greedy_continuation_and_stops_on_ctrl_c() {
    let (prompt, want) = realtok_reference();
    let model = fixture("qwen3_realtok");
    let mut server = start(&["--model", &model, "--port", "0", "--device", "cpu"]);
    let body = json!({"prompt": prompt, "max_tokens": 8, "temperature": 0}).to_string();
    let (status, reply) = http(&server.addr, "POST", "/v1/completions", &body);
    assert_eq!(status, 200, "{reply}");
    let v: Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(v["choices"][0]["text"], want.as_str());
    // The served name is the checkpoint directory's.
    let (status, models) = http(&server.addr, "GET", "/v1/models", "");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], "qwen3_realtok");
    let (status, _) = http(&server.addr, "GET", "/health", "");
    assert_eq!(status, 200);
    let (status, missing) = http(&server.addr, "GET", "/v2/nothing", "");
    assert_eq!(status, 404, "{missing}");
    // Ctrl-C: a clean exit.
    let kill = Command::new("kill")
        .args(["-INT", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = server.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    let rest: Vec<String> = server.rest.try_iter().collect();
    assert!(rest.iter().any(|l| l.contains("shutting down")), "{rest:?}");
    // One log line per request, with its token counts.
    assert!(
        rest.iter()
            .any(|l| l.starts_with("completions: prompt") && l.contains("+ 8 new, length")),
        "{rest:?}"
    );
    assert!(!rest.iter().any(|l| l.contains("panicked")), "{rest:?}");
}

#[test]
fn serve_stops_on_sigterm() {
    let model = fixture("qwen3_realtok");
    let mut server = start(&["--model", &model, "--port", "0", "--device", "cpu"]);
    let (status, _) = http(&server.addr, "GET", "/health", "");
    assert_eq!(status, 200);
    let kill = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = server.child.wait().unwrap();
    assert!(status.success(), "exit status {status}");
    let rest: Vec<String> = server.rest.try_iter().collect();
    assert!(rest.iter().any(|l| l.contains("shutting down")), "{rest:?}");
}

#[test]
fn serve_refuses_a_block_it_cannot_serve_and_a_port_in_use() {
    let model = fixture("qwen3_realtok");
    let o = serve(&["--model", &model, "--port", "0", "--speculative", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(!o.status.success());
    assert!(
        err.contains("error:") && err.contains("--speculative 2") && err.contains("MTP head"),
        "{err}"
    );
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let o = serve(&["--model", &model, "--port", &port, "--device", "cpu"])
        .output()
        .unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(!o.status.success());
    assert!(
        err.contains("error:") && err.contains(&format!("--port {port}")),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
