"""Markdown tables from the JSON files benches/gpu.sh writes into a folder (its summary.md).

    python3 benches/gpu_summary.py OUT
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def hesper_rows(path: Path) -> list[dict]:
    return json.loads(path.read_text())


def llama_rows(path: Path) -> list[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return []


def main() -> None:
    out = Path(sys.argv[1])
    files = sorted(out.glob("hesper-*.json"))
    print("| engine | file | test | t/s | weight GB/s | share of the roofline |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    first_tg = None
    for f in files:
        for r in hesper_rows(f):
            share = r.get("roofline_share")
            gbs = r.get("gb_per_s")
            print(f"| hesper-rs | {Path(r['model']).name} | {r['test']} | "
                  f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | "
                  f"{'-' if gbs is None else f'{gbs:.1f}'} | "
                  f"{'-' if share is None else f'{100 * share:.1f} %'} |")
            if r["test"].startswith("tg") and first_tg is None:
                first_tg = r
    for r in llama_rows(out / "llama-vulkan.json"):
        test = f"pp{r['n_prompt']}" if r["n_gen"] == 0 else f"tg{r['n_gen']}"
        print(f"| llama.cpp ({r.get('backends', '')}, {r.get('gpu_info', '')}) | "
              f"{Path(r['model_filename']).name} | {test} | "
              f"{r['avg_ts']:.2f} ± {r['stddev_ts']:.2f} | | |")
    if first_tg is None:
        return
    r = first_tg
    print(f"\nbackend: {r['backend']}")
    if r.get("gpu"):
        print(r["gpu"])
    if r.get("gpu_copy_gb_per_s"):
        print(f"GPU copy bandwidth (read + written): {r['gpu_copy_gb_per_s']:.1f} GB/s; "
              f"{r['bytes_per_token'] / 1e6:.1f} MB read per token -> roofline "
              f"{r['roofline_ts']:.1f} t/s")
    kernels = r.get("kernels")
    if kernels:
        total = sum(k["us_per_token"] for k in kernels)
        print(f"\nGPU time per generated token by kernel ({Path(r['model']).name}, "
              "timestamp queries, one pass per dispatch while timing):\n")
        print("| kernel | launches/token | µs/token | share | MB/token | GB/s | of copy bandwidth |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")

        def show(v, fmt):
            return "-" if v is None else format(v, fmt)
        for k in kernels:
            share = k.get("bandwidth_share")
            print(f"| {k['kernel']} | {k['launches_per_token']:.0f} | {k['us_per_token']:.1f} | "
                  f"{100 * k['us_per_token'] / max(total, 1e-9):.1f} % | "
                  f"{show(k.get('mb_per_token'), '.2f')} | {show(k.get('gb_per_s'), '.1f')} | "
                  f"{show(None if share is None else 100 * share, '.1f')} |")
        mb = sum(k.get("mb_per_token") or 0 for k in kernels)
        print(f"| total | | {total:.1f} | | {mb:.2f} | {mb / total * 1e3:.1f} | |")


if __name__ == "__main__":
    main()
