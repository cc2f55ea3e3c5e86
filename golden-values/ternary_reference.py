"""The ternary encodings of tiny-llama-f16's layer matrices by gguf-py's reference quantizer
(ggml's `quantize_row_tq1_0_ref` / `quantize_row_tq2_0_ref`, ported in gguf-py), as SHA-256
per tensor: what `hesper-rs quantize ... TQ1_0|TQ2_0` must write (cli/tests/quantize.rs).

Usage: python golden-values/ternary_reference.py   (needs `gguf` and `numpy`; writes
golden-values/out/tiny-llama-f16-ternary.json)
"""

import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as QT, quantize

HERE = Path(__file__).resolve().parent


def main() -> None:
    src = GGUFReader(HERE / "models" / "tiny-llama-f16.gguf")
    out = {
        "source": "models/tiny-llama-f16.gguf",
        "quantizer": f"gguf-py {version('gguf')} quantize()",
    }
    for qt in (QT.TQ1_0, QT.TQ2_0):
        hashes = {}
        for t in src.tensors:
            # The layers' matrices: quantize leaves norms, the embedding and the head.
            if not t.name.startswith("blk.") or len(t.shape) < 2 or "_norm" in t.name:
                continue
            rows = np.array(t.data, dtype=np.float32).reshape(-1, int(t.shape[0]))
            hashes[t.name] = hashlib.sha256(quantize(rows, qt).tobytes()).hexdigest()
        out[qt.name] = hashes
    path = HERE / "out" / "tiny-llama-f16-ternary.json"
    path.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
