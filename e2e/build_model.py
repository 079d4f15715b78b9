"""Build a tiny random-weight Llama and a byte-level BPE tokenizer, locally, for the vLLM e2e run.

Nothing is downloaded: the tokenizer is trained on a few KB of text generated here, the model's
weights are random (seeded). The output is gibberish; the framing, span and timing behaviour of
the server that serves it are real.

    python e2e/build_model.py OUT_DIR

Shape: hidden 128 / 2 heads (head_dim 64, which vLLM's CPU attention supports), 2 layers,
a 512-token context, untied embeddings; the vocabulary (asked for 1 000) comes out at ≈ 200 on
this corpus's ASCII alphabet; ≈ 0.4 M parameters.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from pathlib import Path


def _test_bed_words() -> list[str]:
    """The test bed tokenizer's corpus words, from its module's file: the engine and peer
    venvs this script runs in lack the library's own dependencies, which importing it through
    its package would need."""
    path = Path(__file__).resolve().parent.parent / "latency_analyzer/testing/tokenizer.py"
    spec = importlib.util.spec_from_file_location("_test_bed_tokenizer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it runs
    spec.loader.exec_module(module)
    return list(module.WORDS)


TEST_WORDS = _test_bed_words()

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
WORDS = TEST_WORDS  # the test bed's tokenizer corpus words: one list for both


def corpus(seed: int, sentences: int = 600) -> list[str]:
    """A few KB of word salad to train the tokenizer on."""
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(4, 14))) + "." for _ in range(sentences)]


def build_tokenizer(out: Path, seed: int, vocab: int) -> int:
    """Train a byte-level BPE tokenizer and save it as a transformers fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        # only the characters of the corpus (ASCII): no byte-fragment tokens, so every sampled
        # token decodes to text on its own and streams as a content-carrying chunk
        initial_alphabet=[],
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return len(fast)


def build_model(out: Path, seed: int, vocab: int) -> int:
    """Save a randomly initialised LlamaForCausalLM; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,  # tied + greedy repeats the prompt's last (special) token
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocab", type=int, default=1000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(args.out, args.seed, args.vocab)
    params = build_model(args.out, args.seed, vocab)
    info = {"dir": str(args.out), "vocab": vocab, "parameters": params}
    print(json.dumps(info))


if __name__ == "__main__":
    main()
