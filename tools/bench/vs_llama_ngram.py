"""Greedy decode speed side by side: llama.cpp's `llama-server` (sequential, and `--spec-type ngram-mod`)
against `turbospark generate` (sequential, `--drafter suffix`, and the default `auto`), on the three shipped
workloads of `turbospark bench --workload` (their texts rebuilt from crates/cli/src/bench/workloads.rs),
paired per iteration.

Usage: vs_llama_ngram.py LLAMA_SERVER MODEL.gguf TURBOSPARK [ITERATIONS] [--warm]

LLAMA_SERVER: built from the pinned llama.cpp (shared/tools/llama-cpp.sh; `cmake --build B --target
llama-server`). MODEL.gguf: the embedded testbed converted by tools/fixtures/gguf_models.py (the same
weights turbospark reads from models/testbed). Both run 2 threads, 128 tokens, temperature 0, EOS ignored.
Decode rates: llama.cpp's `timings.predicted_per_second`, ours the `decode=` of `--stats` (both exclude
prefill and load). llama-server keeps ngram-mod's n-gram table across requests, so by default both of its
servers are restarted every iteration (every request is a first request, as for `turbospark generate`);
`--warm` keeps them running (repeated prompts then copy the previous answer) and runs ours as `turbospark
serve --api-key bench --parallel 1` servers (off / suffix / auto), whose suffix drafter likewise remembers
the key's earlier requests; their rates are the servers' `timings.predicted_per_second` too. Prints per workload
the median of each rate and of each iteration's ratios.
"""

import json
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def workloads() -> dict[str, str]:
    src = (ROOT / "crates/cli/src/bench/workloads.rs").read_text()

    def const(name: str) -> str:
        rest = src[src.index(f"const {name}: &str =") :]
        raw = re.match(r'const \w+: &str =\s*r#"(.*?)"#;', rest, re.S)
        if raw:
            return raw.group(1)
        plain = re.match(r'const \w+: &str =\s*"(.*?)";', rest, re.S)
        return bytes(plain.group(1), "utf-8").decode("unicode_escape")

    source, document, quoted = const("SOURCE"), const("DOCUMENT"), const("QUOTED")
    head = "".join(line + "\n" for line in source.split("\n")[:4])
    start = document.index(quoted)
    return {
        "copy-edit": f"# inventory.py\n{source}\n\n# inventory.py, unchanged\n{head}",
        "grounded": f'{document}\n\nAs the report puts it: "{document[start:start + len(quoted) // 2]}',
        "free": const("FREE"),
    }


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--warm"]
    warm = "--warm" in sys.argv
    server, gguf, ours = args[0], args[1], args[2]
    iterations = int(args[3]) if len(args) > 3 else 5
    ports = {"llama seq": (8091, []), "llama ngram-mod": (8092, ["--spec-type", "ngram-mod"])}
    procs: dict[str, subprocess.Popen] = {}

    def start() -> None:
        for name, (port, extra) in ports.items():
            procs[name] = subprocess.Popen(
                [server, "-m", gguf, "-t", "2", "-tb", "2", "--port", str(port), "-c", "4096",
                 "--poll", "0", "-np", "1", "--no-webui", *extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port, _ in ports.values():
            for _ in range(240):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.5)
            else:
                raise SystemExit(f"llama-server on port {port} did not start")

    def stop() -> None:
        for p in procs.values():
            p.terminate()
            p.wait()

    def llama(name: str, text: str) -> float:
        body = json.dumps({"prompt": text, "n_predict": 128, "temperature": 0,
                           "cache_prompt": False, "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{ports[name][0]}/completion", body,
                                     {"Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(req))["timings"]["predicted_per_second"]

    ours_ports = {"ours off": (8093, ["--speculative", "off"]), "ours suffix": (8094, ["--drafter", "suffix"]),
                  "ours auto": (8095, [])}

    def start_ours() -> None:
        for name, (port, extra) in ours_ports.items():
            procs[name] = subprocess.Popen(
                # One worker, as llama-server's one slot (-np 1): the key's requests share its memory.
                [ours, "serve", "--threads", "2", "--port", str(port), "--api-key", "bench", "--parallel", "1",
                 *extra],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port, _ in ours_ports.values():
            for _ in range(240):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.5)
            else:
                raise SystemExit(f"turbospark serve on port {port} did not start")

    def served(name: str, text: str) -> float:
        body = json.dumps({"model": "testbed", "prompt": text, "max_tokens": 128, "temperature": 0,
                           "ignore_eos": True}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{ours_ports[name][0]}/v1/completions", body,
                                     {"Content-Type": "application/json", "Authorization": "Bearer bench"})
        return json.load(urllib.request.urlopen(req))["timings"]["predicted_per_second"]

    def turbo(text: str, extra: list[str]) -> float:
        p = subprocess.run([ours, "generate", "--threads", "2", "--max-tokens", "128", "--stats", *extra],
                           input=text, capture_output=True, text=True, check=True)
        line = next(l for l in p.stderr.splitlines() if "decode=" in l)
        return float(re.search(r"decode=[0-9.]+s \(([0-9.]+) tok/s", line).group(1))

    results: dict[tuple[str, str], list[float]] = {}
    if warm:
        start()
        start_ours()
    for workload, text in workloads().items():
        for _ in range(iterations):
            if not warm:
                start()
            row = {
                "llama seq": llama("llama seq", text),
                "llama ngram-mod": llama("llama ngram-mod", text),
            }
            for name, (_, extra) in ours_ports.items():
                row[name] = served(name, text) if warm else turbo(text, extra)
            if not warm:
                stop()
            row["ngram-mod / llama seq"] = row["llama ngram-mod"] / row["llama seq"]
            row["suffix / ours off"] = row["ours suffix"] / row["ours off"]
            row["auto / ours off"] = row["ours auto"] / row["ours off"]
            row["suffix / ngram-mod"] = row["ours suffix"] / row["llama ngram-mod"]
            row["auto / ngram-mod"] = row["ours auto"] / row["llama ngram-mod"]
            for k, v in row.items():
                results.setdefault((workload, k), []).append(v)
    if warm:
        stop()
    for (workload, k), v in results.items():
        print(f"{workload:10} {k:22} median {statistics.median(v):8.2f}   {' '.join(f'{x:.2f}' for x in v)}")


if __name__ == "__main__":
    main()
