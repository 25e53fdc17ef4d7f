"""Byte-level BPE tokenizer with FIM special tokens, trained on the training split."""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .data import EOT, PAD, SPECIAL_TOKENS, corpus_files, read_source


def train_tokenizer(vocab_size: int, files: list[Path] | None = None) -> Tokenizer:
    files = files if files is not None else corpus_files()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((read_source(p) for p in files), trainer=trainer, length=len(files))
    return tok


def save_hf_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """Write tokenizer.json plus the HF config so AutoTokenizer loads the directory offline."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOT, bos_token=EOT, unk_token=None, pad_token=PAD,
        additional_special_tokens=SPECIAL_TOKENS[1:4], model_max_length=model_max_length)
    fast.save_pretrained(str(out_dir))
