"""Write a tiny random-weight Llama as a GGUF file, locally, for the llama.cpp e2e run.

Nothing is downloaded and nothing is converted: the file is written directly with the ``gguf``
package's ``GGUFWriter`` (numpy arrays, f32). The tokenizer is a small SentencePiece-style
vocabulary (``tokenizer.ggml.model = "llama"``): the special tokens, the 256 byte tokens
``<0x00>``…``<0xFF>`` (byte fallback) and the words of ``build_model.WORDS`` with a leading
``▁``. Random weights sample byte tokens too; a lone byte of a multi-byte character decodes to
nothing yet, so such a model streams some tokens with empty text, as the tiny vLLM model did.

    python e2e/build_gguf.py OUT.gguf

Shape: hidden 128 / 2 heads of 64, 2 layers, feed-forward 256, a 512-token context.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from build_model import CHAT_TEMPLATE, WORDS

SPECIAL = ["<unk>", "<s>", "</s>"]
HIDDEN, HEADS, LAYERS, FF, CONTEXT = 128, 2, 2, 256, 512


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types (1 normal, 2 unknown, 3 control, 6 byte)."""
    tokens = [*SPECIAL, *(f"<0x{b:02X}>" for b in range(256))]
    types = [2, 3, 3, *([6] * 256)]
    letters = [*"abcdefghijklmnopqrstuvwxyz"]
    words = [f"\u2581{w}" for w in dict.fromkeys(WORDS)] + ["\u2581", ".", *letters]
    tokens += words
    types += [1] * len(words)
    scores = [0.0] * len(SPECIAL) + [0.0] * 256 + [-float(i) for i in range(len(words))]
    return tokens, scores, types


def build(out: Path, seed: int) -> dict[str, object]:
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab, head_dim = len(tokens), HIDDEN // HEADS

    def weight(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(out), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FF)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_chat_template(CHAT_TEMPLATE)
    # numpy shapes are (rows = outputs, columns = inputs); GGUF stores the reverse order
    writer.add_tensor("token_embd.weight", weight(n_vocab, HIDDEN, scale=0.5))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, HIDDEN, scale=0.5))
    for i in range(LAYERS):
        blk = f"blk.{i}"
        writer.add_tensor(f"{blk}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(f"{blk}.{name}.weight", weight(HIDDEN, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"{blk}.ffn_gate.weight", weight(FF, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_up.weight", weight(FF, HIDDEN))
        writer.add_tensor(f"{blk}.ffn_down.weight", weight(HIDDEN, FF))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"file": str(out), "vocab": n_vocab, "bytes": out.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(build(args.out, args.seed)))


if __name__ == "__main__":
    main()
