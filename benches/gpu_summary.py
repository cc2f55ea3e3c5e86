"""Markdown tables from the JSON files benches/gpu.sh writes into a folder (its summary.md): the
ratios of hesper-rs to llama.cpp's Vulkan backend round by round, then every engine's speeds, then
hesper-rs's GPU time per kernel for each decode test.

    python3 benches/gpu_summary.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def read_rows(path: Path) -> list[dict]:
    """A JSON array of test rows; a file a failed run left empty or cut short holds none."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def show(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def percent(share) -> str:
    return "-" if share is None else f"{100 * share:.1f} %"


def print_speeds(out: Path) -> list[dict]:
    """One row per engine, file and test; returns hesper-rs's decode rows."""
    print("| engine | file | test | t/s | weight GB/s | share of the roofline |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    decode = []
    for f in sorted(out.glob("hesper-*.json")):
        # A run with flags of its own (I2_S on the shader cores) is named beside its file.
        run = f.stem.removeprefix("hesper-").rsplit("-r", 1)[0]
        extra = f" ({run})" if run.endswith("-shader-cores") else ""
        for r in read_rows(f):
            share = r.get("roofline_share")
            print(f"| hesper-rs | {Path(r['model']).name}{extra} | {r['test']} | "
                  f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | {show(r.get('gb_per_s'), '.1f')} | "
                  f"{percent(share)} |")
            if r["test"].startswith("tg"):
                decode.append(r)
    for f in sorted(out.glob("llama-vulkan*.json")):
        for r in read_rows(f):
            test = test_name(r)
            print(f"| llama.cpp ({r.get('backends', '')}, {r.get('gpu_info', '')}) | "
                  f"{Path(r['model_filename']).name} | {test} | "
                  f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | | |")
    return decode


def test_name(r: dict) -> str:
    """llama-bench's name of a test row: pp512 or tg128."""
    return f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"


def print_ratios(out: Path) -> None:
    """Per round, hesper-rs's t/s over llama.cpp's on the file pairs.txt sets beside ours."""
    pairs = []
    pairs_file = out / "pairs.txt"
    if pairs_file.exists():
        pairs = [line.split() for line in pairs_file.read_text().splitlines() if line.strip()]
    rounds = sorted({int(f.stem.rsplit("-r", 1)[1]) for f in out.glob("hesper-*-r*.json")})
    rows = []
    for ours, theirs in (p for p in pairs if len(p) == 2):
        for n in rounds:
            mine = {r["test"]: r["avg_ts"] for r in read_rows(out / f"hesper-{ours}-r{n}.json")}
            peer = {test_name(r): r["avg_ts"]
                    for r in read_rows(out / f"llama-vulkan-{theirs}-r{n}.json")}
            for test in sorted(mine, key=lambda t: (not t.startswith("pp"), t)):
                if test in peer and peer[test] > 0:
                    rows.append((ours, theirs, test, n, mine[test], peer[test]))
    if not rows:
        return
    print("| hesper-rs file | llama.cpp Vulkan file | test | round | hesper-rs t/s | "
          "llama.cpp t/s | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for ours, theirs, test, n, a, b in rows:
        print(f"| {ours} | {theirs} | {test} | {n} | {a:.1f} | {b:.1f} | {a / b:.3f}× |")
    print()


def print_profile(r: dict) -> None:
    """Host time, roofline and GPU time per kernel of one decode test."""
    print(f"\n### {Path(r['model']).name}, {r['test']}\n")
    print(f"backend: {r['backend']}")
    if r.get("gpu"):
        print(r["gpu"])
    if r.get("gpu_copy_gb_per_s"):
        print(f"GPU copy bandwidth (read + written): {r['gpu_copy_gb_per_s']:.1f} GB/s; "
              f"{r['bytes_per_token'] / 1e6:.1f} MB read per token -> roofline "
              f"{r['roofline_ts']:.1f} t/s")
    kernels = r.get("kernels")
    if not kernels:
        return
    total = sum(k["us_per_token"] for k in kernels)
    print("\nGPU time per generated token by kernel (timestamp queries, one pass per dispatch "
          "while timing):\n")
    print("| kernel | launches/token | µs/token | share | MB/token | GB/s | of copy bandwidth |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in kernels:
        share = k.get("bandwidth_share")
        print(f"| {k['kernel']} | {k['launches_per_token']:.0f} | {k['us_per_token']:.1f} | "
              f"{100 * k['us_per_token'] / max(total, 1e-9):.1f} % | "
              f"{show(k.get('mb_per_token'), '.2f')} | {show(k.get('gb_per_s'), '.1f')} | "
              f"{percent(share)} |")
    mb = sum(k.get("mb_per_token") or 0 for k in kernels)
    print(f"| total | | {total:.1f} | | {mb:.2f} | {mb / max(total, 1e-9) * 1e3:.1f} | |")


def main() -> None:
    out = Path(sys.argv[1])
    print_ratios(out)
    for r in print_speeds(out):
        print_profile(r)


if __name__ == "__main__":
    main()
