"""Build a tiny TRL SFT setup offline: ``DIR/model`` (a two-layer Llama and its tokenizer) and ``DIR/data/train.jsonl``.

Nothing is downloaded: the tokenizer is a word-level ``tokenizers`` model trained on the generated text and wrapped in
``PreTrainedTokenizerFast``; the model is a ``LlamaForCausalLM`` made from a config. ``datasets.load_dataset(DIR/data)``
reads the directory's ``train.jsonl`` (a ``text`` column) as its ``train`` split, which is what ``trl sft
--dataset_name data`` does (trl 1.16 ``trl/scripts/sft.py``: ``load_dataset(dataset_name, name=dataset_config)``).

    python make_tiny.py DIR [--rows 256] [--hidden 64] [--layers 2]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

TEXT = ("the a cat dog sat on mat ran far quick brown fox jumps over lazy tiny model learns text from data while "
        "every step counts tokens and batches")
WORDS = TEXT.split()


def build(root: Path, rows: int, hidden: int, layers: int) -> None:
    rng = random.Random(0)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(40, 120))) for _ in range(rows)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<s>", "</s>"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(fast), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, pad_token_id=fast.pad_token_id,
                         bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(root / "model")
    fast.save_pretrained(root / "model")
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "data" / "train.jsonl").write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    build(args.root, args.rows, args.hidden, args.layers)


if __name__ == "__main__":
    main()
