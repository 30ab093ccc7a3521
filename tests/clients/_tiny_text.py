"""A word-level tokenizer built in memory and tiny in-memory datasets, for the client tests (no download)."""

from __future__ import annotations

WORDS = (
    "the a cat dog bird sat ran flew on under over mat tree roof big small red blue quick slow and then it was "
    "very happy sad today night day one two three four five six seven eight nine ten yes no good bad"
).split()
SPECIALS = ("[PAD]", "[UNK]", "[BOS]", "[EOS]")


def tiny_tokenizer():
    """A ``PreTrainedTokenizerFast`` over :data:`WORDS` (fewer than 64 ids, the tiny models' vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(SPECIALS + tuple(WORDS))}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", bos_token="[BOS]", eos_token="[EOS]"
    )
    assert len(wrapped) <= 64
    return wrapped


def sentences(count: int = 8) -> list[str]:
    return [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 3)) for i in range(count)]


def tiny_llama_with_tokenizer():
    """The tests' tiny Llama and :func:`tiny_tokenizer`, the model's pad and eos ids set to the tokenizer's."""
    from helpers import tiny_llama

    model = tiny_llama()
    tokenizer = tiny_tokenizer()
    model.config.pad_token_id = tokenizer.pad_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    return model, tokenizer


#: Trainer arguments of the client tests: one quiet CPU step that changes no weight (learning rate 0).
COMMON = dict(
    max_steps=1, per_device_train_batch_size=2, learning_rate=0.0, report_to=[], use_cpu=True,
    save_strategy="no", logging_strategy="no", dataloader_num_workers=0, seed=0,
)
