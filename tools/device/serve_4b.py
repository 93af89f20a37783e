#!/usr/bin/env python3
"""Decode speed through the HTTP server on the 4B shape (session 22): synthesizes the random-weight
Qwen3.5-4B-like checkpoint (`turbospark synth`), gives it Qwen3's real tokenizer (fixtures/qwen3_realtok:
the vocabulary fits the shape's 151936 rows), serves it on CUDA with --speculative off, and sends
completions of a 512-token prompt (token ids) for 128 tokens with ignore_eos: the server's `timings` against
`turbospark bench`-style figures (cuda_check's table: 427.4 tok/s end to end, run 176).
Usage (device, repo root): python3 tools/device/serve_4b.py /tmp/b   (holding ts)"""
import json, os, shutil, subprocess, sys, time, urllib.request

import servelib

ts = f"{sys.argv[1]}/ts"
model = "/tmp/qwen35-4b"
if not os.path.exists(f"{model}/config.json"):
    t0 = time.time()
    subprocess.run([ts, "synth", "--shape", "qwen35-4b", "--out", model], check=True)
    print(f"synth {time.time() - t0:.1f}s", flush=True)
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(f"fixtures/qwen3_realtok/{f}", f"{model}/{f}")
server, addr = servelib.start([ts, "serve", "--device", "cuda", "--model", model, "--port", "0",
                               "--speculative", "off"])
assert addr, "the server did not start"


def post(body):
    req = urllib.request.Request(f"http://{addr}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=300) as r:
        v = json.loads(r.read())
    return v, time.time() - t0


for i in range(6):
    # A different 512-token prompt each time, so nothing is reused from the session.
    prompt = [(1000 + 37 * i + 7 * j) % 150000 for j in range(512)]
    v, wall = post({"prompt": prompt, "max_tokens": 128, "temperature": 0, "ignore_eos": True})
    t = v["timings"]
    print(f"request {i}: prompt {t['prompt_n']} in {t['prompt_ms']:.1f} ms ({t['prompt_per_second']:.0f} tok/s), "
          f"decode {t['predicted_n']} in {t['predicted_ms']:.1f} ms ({t['predicted_per_second']:.1f} tok/s), "
          f"HTTP wall {wall * 1e3:.1f} ms", flush=True)
server.send_signal(2)
server.wait(timeout=30)
for line in server.stderr:
    print("serve:", line.rstrip(), flush=True)
