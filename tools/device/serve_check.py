#!/usr/bin/env python3
"""The server and the C API on the GPU (session 22): `turbospark serve --device cuda` answers a greedy
completion with the text `turbospark generate --device cuda --speculative off` writes (the server
speculates with `auto`), a streamed chat equals the whole chat reply, the metrics show drafted tokens;
the C smoke program (crates/capi/tests/c/smoke.c) on CUDA streams the same greedy text.
Usage (device, repo root): python3 tools/device/serve_check.py /tmp/b   (holding ts, smoke, libturbospark.so)
Prints PASS / FAIL lines and exits 1 on any FAIL. Python standard library only."""
import json, os, subprocess, sys, time, urllib.request

import servelib

b = sys.argv[1]
ts, model, prompt = f"{b}/ts", "models/testbed", "def fibonacci(n):"
fails = 0


def check(name, ok, detail=""):
    global fails
    fails += 0 if ok else 1
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else f": {detail}"), flush=True)


def generate(n):
    out = subprocess.run([ts, "generate", "--device", "cuda", "--model", model, "--speculative", "off",
                          "--max-tokens", str(n), prompt], capture_output=True, text=True, timeout=300)
    return out.stdout[:-1] if out.stdout.endswith("\n") else out.stdout


def post(addr, path, body, stream=False):
    req = urllib.request.Request(f"http://{addr}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        raw = r.read().decode()
    if not stream:
        return json.loads(raw)
    return [l[6:] for l in raw.split("\n") if l.startswith("data: ")]


want48 = generate(48)
server, addr = servelib.start([ts, "serve", "--device", "cuda", "--model", model, "--port", "0"])
check("serve starts on cuda", addr is not None)
if addr:
    t0 = time.time()
    v = post(addr, "/v1/completions", {"prompt": prompt, "max_tokens": 48, "temperature": 0})
    check("greedy completion == sequential generate", v["choices"][0]["text"] == want48,
          f"{v['choices'][0]['text']!r} vs {want48!r}")
    print("timings:", json.dumps(v.get("timings")), f"wall {time.time() - t0:.3f}s", flush=True)
    chat = {"messages": [{"role": "user", "content": "Write a function that adds two numbers."}],
            "max_tokens": 32, "temperature": 0}
    whole = post(addr, "/v1/chat/completions", chat)["choices"][0]["message"]["content"]
    data = post(addr, "/v1/chat/completions", dict(chat, stream=True), stream=True)
    streamed = "".join(json.loads(d)["choices"][0]["delta"].get("content", "") for d in data[:-1])
    check("streamed chat == whole chat", streamed == whole and data[-1] == "[DONE]", f"{streamed!r} vs {whole!r}")
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=30) as r:
        metrics = r.read().decode()
    proposed = [l for l in metrics.splitlines() if l.startswith("turbospark_spec_proposed_tokens_total")]
    print(proposed, flush=True)
    check("the server drafted on the GPU", proposed and int(proposed[0].split()[-1]) > 0, metrics)
server.send_signal(2)
check("serve exits cleanly on SIGINT", server.wait(timeout=30) == 0)

want24 = generate(24)
env = dict(os.environ, TS_DEVICE="cuda", LD_LIBRARY_PATH=b)
out = subprocess.run([f"{b}/smoke", model, prompt], capture_output=True, text=True, env=env, timeout=300)
print("smoke stderr:", out.stderr.strip(), flush=True)
streamed = out.stdout.split("\n--result--\n")[0].split("\n", 1)[-1] if out.returncode == 0 else None
check("C API on cuda streams the greedy text", streamed == want24, f"rc {out.returncode}: {out.stdout!r} vs {want24!r}")
sys.exit(1 if fails else 0)
