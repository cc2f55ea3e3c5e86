#!/usr/bin/env python3
"""Write llama.cpp's token ids for a set of strings, as golden values for hesper-rs's tokenizer.

Run with a Python that has llama-cpp-python 0.3.36 (its vendored llama.cpp is commit 0c1e57098):

    python make_tokenizer_golden.py

Reads, next to this script, llama.cpp's test vocabularies (copied from the llama-cpp-python
0.3.36 sdist, vendor/llama.cpp/models/): ggml-vocab-llama-bpe.gguf and ggml-vocab-llama-spm.gguf,
with their .inp test strings. Writes llama-bpe.json, llama-spm.json and llama-bpe-nopre.json (the
llama-bpe vocabulary with `tokenizer.ggml.pre` removed, so llama.cpp uses its 'default' split).

Each JSON: {"source": ..., "vocab": ..., "cases": [{"text", "add_special", "parse_special", "ids"}]}.
"""
import json
import os
import random
import struct
import sys
import tempfile

from llama_cpp import llama_cpp as C

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = ("llama.cpp 0c1e57098 via llama-cpp-python 0.3.36 (PyPI sdist, built from source): "
          "llama_tokenize(vocab, text, add_special, parse_special) on a vocab_only model")
SEP = "\n__ggml_vocab_test__\n"

EXTRA = [
    # ASCII prose and punctuation
    "The capital of France is",
    "I've 12345 apples, don't you? We'll see; they're here.",
    "hello!!! ... ?? (yes) [no] {maybe} <tag> a+b=c ~x^y |z|",
    "Mr. O'Neil's dog said \"woof\" -- twice.",
    "ALL CAPS SHOUTING AND MiXeD cAsE wOrDs",
    "'S 'T 'RE 'VE 'M 'LL 'D and 'ſ",
    # accents, other scripts
    "naïve café résumé Ångström façade Zürich",
    "Ελληνικά και русский язык, עברית, العربية",
    "東京は日本の首都です。北京是中国的首都。",
    "한국어 텍스트와 ひらがな カタカナ",
    "हिन्दी भाषा और தமிழ்",
    # emoji and symbols
    "🙂🙃😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈",
    "∑∫√∞ ≠ ≤ ≥ → ← ↔ © ® ™ € £ ¥",
    "\u00a0non-breaking\u2003em space\u200bzero width",
    # code
    "fn main() {\n    println!(\"Hello, world!\");\n}\n",
    "def f(x):\n\treturn x**2 if x > 0 else -x  # comment\n",
    "for (int i = 0; i < n; ++i) { a[i] += b[i] * 2; }",
    "<html><body class=\"x\">&amp; &lt;</body></html>",
    "SELECT * FROM t WHERE id = 42 AND name LIKE '%abc%';",
    # whitespace runs
    "a  b   c    d     e",
    "a\tb\t\tc\t\t\td",
    "a\r\nb\r\n\r\nc",
    "line1\nline2\n\n\nline5",
    "trailing spaces   ",
    "   leading spaces",
    " \t \n \r\n mixed \t\t  \n\n  whitespace",
    "\n\n\n\n\n\n\n\n",
    "                                ",
    # numbers
    "1234567",
    "3.14159265358979323846264338327950288419716939937510",
    "12345678901234567890 1,000,000 0x1F 1e-10 -42 +7",
    "2024-11-22 13:45:00 v1.2.3 192.168.0.1",
    # special-token-looking text
    "<|eot_id|>",
    "User: Hey, are you conscious?<|eot_id|>Assistant:",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<s>Hello</s> <unk> world",
    "<s> [INST] Hi [/INST]",
    "<|end_of_text|><|reserved_special_token_5|>",
    "<|eot_id|<|eot_id|>|>",
    # llama.cpp tokenizer edge cases
    "Hi<|eot_id|>",
    " (",
    "a\r\nb",
    "hello world" * 20,
]


# Character pools for random strings (a differential test against llama.cpp's regex engine).
POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "0123456789",
    "0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "      \t\n\r",
    "\u00a0\u2003\u3000\u2028\u200b\u200d\u00ad\x0b\x0c\x85",
    "'s 't 're 've 'm 'll 'd 'S 'T 'RE 'VE 'M 'LL 'D",
    "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿÀÉÎÕÜßœŒ",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔ",
    "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВ",
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年",
    "가나다라마바사아자차카타파하한국어",
    "ひらがなカタカナ漢字",
    "हिन्दीதமிழ்ภาษาไทยعربيעברית",
    "😀😁😂🤣😃😄🦙🚀👍🏽👨‍👩‍👧❤️🏳️‍🌈",
    "∑∫√∞≠≤≥→←↔©®™€£¥§¶•…‰′″‹›«»",
    "\u0301\u0308\u0323\u20dd\ufe0f",
    "①②③¹²³½¼ⅠⅡⅢ٣٤٥०१२",
]


def random_strings(seed, n):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 10)):
            pool = rng.choice(POOLS)
            if pool.startswith("'s"):
                parts.append(rng.choice(pool.split(" ")))
            else:
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 6))))
        out.append("".join(parts))
    return out


def read_inp(path):
    raw = open(path, encoding="utf-8").read()
    out, pos = [], 0
    while pos < len(raw):
        nxt = raw.find(SEP, pos)
        if nxt < 0:
            out.append(raw[pos:])
            break
        out.append(raw[pos:nxt])
        pos = nxt + len(SEP)
    return out


def load(path):
    params = C.llama_model_default_params()
    params.vocab_only = True
    model = C.llama_model_load_from_file(path.encode(), params)
    if not model:
        sys.exit(f"llama.cpp could not load {path}")
    return model


def tokenize(model, text, add_special, parse_special):
    vocab = C.llama_model_get_vocab(model)
    data = text.encode("utf-8")
    cap = len(data) + 8
    buf = (C.llama_token * cap)()
    n = C.llama_tokenize(vocab, data, len(data), buf, cap, add_special, parse_special)
    if n < 0:
        sys.exit(f"llama_tokenize failed ({n}) on {text!r}")
    return list(buf[:n])


def gguf_metadata(src):
    """The metadata of a GGUF v3 file: (number of tensors, [(key, value)]), each value as its
    raw bytes (type id, then data). Exits on anything else."""
    blob = open(src, "rb").read()
    magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", blob, 0)
    if magic != b"GGUF" or version != 3:
        sys.exit(f"{src}: expected a GGUF v3 file")
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip_value(pos, ty):
        if ty in fixed:
            return pos + fixed[ty]
        if ty == 8:
            (n,) = struct.unpack_from("<Q", blob, pos)
            return pos + 8 + n
        if ty == 9:
            elem, count = struct.unpack_from("<IQ", blob, pos)
            pos += 12
            if elem in fixed:
                return pos + fixed[elem] * count
            for _ in range(count):
                pos = skip_value(pos, elem)
            return pos
        sys.exit(f"{src}: unknown GGUF value type {ty}")

    pos, kvs = 24, []
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", blob, pos)
        key = blob[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (ty,) = struct.unpack_from("<I", blob, pos)
        end = skip_value(pos + 4, ty)
        kvs.append((key, blob[pos:end]))
        pos = end
    return n_tensors, kvs


def gguf_text(s):
    """A GGUF string: u64 length, then UTF-8 bytes."""
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_tensorless_gguf(dst, kvs):
    """Writes a GGUF v3 file holding only the metadata `kvs` ([(key, raw value)])."""
    out = struct.pack("<4sIQQ", b"GGUF", 3, 0, len(kvs))
    out += b"".join(gguf_text(key) + value for key, value in kvs)
    out += b"\0" * (-len(out) % 32)
    open(dst, "wb").write(out)


def gguf_without_key(src, dst, drop):
    """Copies a GGUF v3 file that has no tensors, leaving out metadata key `drop`."""
    n_tensors, kvs = gguf_metadata(src)
    if n_tensors != 0:
        sys.exit(f"{src}: expected a tensor-less GGUF v3 file")
    kept = [(key, value) for key, value in kvs if key != drop]
    if len(kept) != len(kvs) - 1:
        sys.exit(f"{src}: key {drop} not found")
    write_tensorless_gguf(dst, kept)


# Where GPT-4o's split parts from Llama 3's: a capitalized run before lowercase letters starts
# a word of its own (CamelCase, all-caps acronyms before a word), contractions of any case stay
# on their word, punctuation keeps the newlines and slashes after it, non-ASCII letters count
# as upper or lower case
GPT4O_EXTRA = [
    "HelloWorld and iPhone and McDonald's",
    "XMLHttpRequest parseJSONString getHTTPResponseCode",
    "DON'T YOU'RE WE'LL they'VE i'M",
    "ABCdef ABC def aBC",
    "path/to/file.txt http://example.com/a/b?c=d",
    "end.\n\nnext;\r\nline//comment\n",
    "ÉcoleNormale ÜberMensch ΑθήναΠόλη МоскваГород",
    "12345678 3.14159 1,000,000 2024-12-02",
    "foo_barBaz __init__ camelCaseVar SCREAMING_SNAKE",
    "   leading and trailing   ",
    "emoji🦙Llama and 日本語Text",
]


def gguf_with_text_key(src, dst, key, text):
    """Copies a GGUF v3 file that has no tensors, with the string metadata `key` set to `text`."""
    n_tensors, kvs = gguf_metadata(src)
    if n_tensors != 0 or key not in [k for k, _ in kvs]:
        sys.exit(f"{src}: expected a tensor-less GGUF v3 file with key {key}")
    value = struct.pack("<I", 8) + gguf_text(text)
    write_tensorless_gguf(dst, [(k, value if k == key else v) for k, v in kvs])


def cases_for(model, strings):
    cases = []
    for text in strings:
        combos = [(False, False), (True, True)]
        if "<" in text:
            combos += [(True, False), (False, True)]
        for add_special, parse_special in combos:
            ids = tokenize(model, text, add_special, parse_special)
            cases.append({"text": text, "add_special": add_special, "parse_special": parse_special, "ids": ids})
    return cases


def write(name, vocab_file, model, strings, note):
    cases = cases_for(model, strings)
    doc = {"source": SOURCE, "vocab": vocab_file, "note": note, "cases": cases}
    path = os.path.join(HERE, name)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=0)
        f.write("\n")
    print(f"{name}: {len(cases)} cases")


def main():
    C.llama_backend_init()
    bpe_file = os.path.join(HERE, "ggml-vocab-llama-bpe.gguf")
    spm_file = os.path.join(HERE, "ggml-vocab-llama-spm.gguf")
    bpe_strings = read_inp(bpe_file + ".inp") + EXTRA
    spm_strings = read_inp(spm_file + ".inp") + EXTRA

    write("llama-bpe.json", "ggml-vocab-llama-bpe.gguf", load(bpe_file), bpe_strings,
          "tokenizer.ggml.pre = llama-bpe: llama.cpp's Llama-3 split")
    write("llama-spm.json", "ggml-vocab-llama-spm.gguf", load(spm_file), spm_strings,
          "SentencePiece (tokenizer.ggml.model = llama)")
    with tempfile.TemporaryDirectory() as tmp:
        stripped = os.path.join(tmp, "ggml-vocab-llama-bpe-nopre.gguf")
        gguf_without_key(bpe_file, stripped, "tokenizer.ggml.pre")
        nopre = load(stripped)
        write("llama-bpe-nopre.json", "ggml-vocab-llama-bpe.gguf without tokenizer.ggml.pre", nopre,
              bpe_strings, "tokenizer.ggml.pre removed: llama.cpp's 'default' split, add_bos off")
        gpt4o_file = os.path.join(tmp, "ggml-vocab-llama-bpe-gpt4o.gguf")
        gguf_with_text_key(bpe_file, gpt4o_file, "tokenizer.ggml.pre", "gpt-4o")
        gpt4o = load(gpt4o_file)
        write("llama-bpe-gpt4o.json", "ggml-vocab-llama-bpe.gguf with tokenizer.ggml.pre = gpt-4o",
              gpt4o, bpe_strings + GPT4O_EXTRA, "tokenizer.ggml.pre = gpt-4o: llama.cpp's GPT-4o split "
              "(gpt-oss's o200k) over Llama 3's merges, add_bos off")
        write_random(load(bpe_file), nopre, load(spm_file), gpt4o)


def write_random(bpe, nopre, spm, gpt4o):
    """random.json: seeded random strings, add_special = parse_special = false, ids per vocab."""
    strings = random_strings(20261122, 1000)
    doc = {
        "source": SOURCE,
        "note": "random strings (make_tokenizer_golden.py random_strings, seed 20261122); "
                "add_special = parse_special = false",
        "texts": strings,
        "llama-bpe": [tokenize(bpe, s, False, False) for s in strings],
        "llama-bpe-nopre": [tokenize(nopre, s, False, False) for s in strings],
        "llama-spm": [tokenize(spm, s, False, False) for s in strings],
        "llama-bpe-gpt4o": [tokenize(gpt4o, s, False, False) for s in strings],
    }
    with open(os.path.join(HERE, "random.json"), "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"random.json: {len(strings)} strings x 4 vocabularies")


if __name__ == "__main__":
    main()
