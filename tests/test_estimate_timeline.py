"""The step as a timeline (:mod:`hf_ckpt.estimation._timeline`): the estimate's first and steady step against real
CPU steps of tiny models trained by the optimizer the ``Trainer`` builds, within 3 %: the gradients appear as the
activations are freed, the optimizer's states exist from the first ``step()``, the step's temporaries on top.
Each setting the estimate takes: checkpointing, Adafactor, LoRA with dropout and chosen targets, classification
and question-answering heads, the activation offload, the chunked head and MLP. (4-bit bases and bitsandbytes' optimizers:
``tests/clients/test_qlora.py`` and ``tests/clients/test_bitsandbytes.py``.)"""

from __future__ import annotations

import pytest
import torch
import transformers

import hf_ckpt
from hf_ckpt.estimation import estimate
from hf_ckpt.estimation._check import training_peaks
from hf_ckpt.estimation._labels import batch_for

pytestmark = pytest.mark.edge_releases  # the matrix's ends only (tests/release_guard.py)

BATCH, SEQ = 2, 64
_LLAMA = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=4, vocab_size=256, max_position_embeddings=128)
_BERT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=4, vocab_size=256,
             max_position_embeddings=128)


def _lora():
    peft = pytest.importorskip("peft")
    return peft.LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])


#: name -> (config, class, optim, enable options, the estimate's row, peft config maker)
SETTINGS = {
    "none": (transformers.LlamaConfig(**_LLAMA), transformers.LlamaForCausalLM, "adamw_torch", None, "none", None),
    "full": (transformers.LlamaConfig(**_LLAMA), transformers.LlamaForCausalLM, "adamw_torch", {}, "full", None),
    "adafactor": (transformers.LlamaConfig(**_LLAMA), transformers.LlamaForCausalLM, "adafactor", {}, "full", None),
    "lora-dropout": (transformers.LlamaConfig(**_LLAMA), transformers.LlamaForCausalLM, "adamw_torch", None, "none",
                     _lora),
    "bert-sequence": (transformers.BertConfig(**_BERT), transformers.BertForSequenceClassification, "adamw_torch",
                      None, "none", None),
    "bert-qa": (transformers.BertConfig(**_BERT), transformers.BertForQuestionAnswering, "adamw_torch", {}, "full",
                None),
    "offload": (transformers.LlamaConfig(**_LLAMA), transformers.LlamaForCausalLM, "adamw_torch", {"offload": True},
                "full+offload", None),
    "mlp-chunks": (transformers.LlamaConfig(**_LLAMA), transformers.LlamaForCausalLM, "adamw_torch",
                   {"mlp_chunk_size": 16}, "full+mlp:16", None),
}


def _measured(model, batch, optim: str, tmp_path) -> list[int]:
    """The peak of the first and of the second step with the ``Trainer``'s ``optim``, above the parameters."""
    args = transformers.TrainingArguments(output_dir=str(tmp_path), optim=optim, use_cpu=True, report_to=[])
    return training_peaks(model, batch, transformers.Trainer(model=model, args=args).create_optimizer())


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("name", SETTINGS)
def test_first_and_steady_step_match_real_cpu_steps(name, tmp_path):
    config, cls, optim, options, row, lora = SETTINGS[name]
    config.architectures = [cls.__name__]
    peft_config = lora() if lora else None
    torch.manual_seed(0)
    model = cls(config).train()
    batch = {**batch_for(model, BATCH, SEQ), "input_ids": torch.randint(3, 256, (BATCH, SEQ))}
    if peft_config is not None:
        import peft

        model = peft.get_peft_model(model, peft_config).train()
    if options is not None:
        hf_ckpt.enable(model, **options)
    first, steady = _measured(model, batch, optim, tmp_path)
    chunks = {key: value for key, value in (options or {}).items() if key.endswith("_chunk_size")}
    made = estimate(config, batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", optimizer=optim,
                    peft_config=peft_config, strategies=(row.split("+")[0],),
                    offload_activations=row.endswith("+offload"), **chunks)
    params = made.parameters_bytes
    assert made.first_step_peak_bytes[row] - params == pytest.approx(first, rel=0.03), made.peak_phase[row]
    assert made.peak_bytes[row] - params == pytest.approx(steady, rel=0.03), made.peak_phase[row]
    assert made.first_step_peak_bytes[row] <= made.peak_bytes[row]


def test_gradient_accumulation_holds_every_gradient_through_backward():
    config = transformers.LlamaConfig(**_LLAMA, architectures=["LlamaForCausalLM"])
    options = dict(batch_size=BATCH, seq_len=SEQ, dtype="float32", device="cpu", strategies=("none",))
    one, four = estimate(config, **options), estimate(config, gradient_accumulation_steps=4, **options)
    whole = four.fixed_bytes + four.activation_bytes["none"] + four.transient_bytes["none"]
    assert four.peak_bytes["none"] == whole > one.peak_bytes["none"]
    assert four.peak_phase["none"] == "backward, gradients held whole"
    assert four.first_step_peak_bytes["none"] == whole - four.optimizer_bytes
    with pytest.raises(ValueError, match=r"^gradient_accumulation_steps must be a positive int; got 0$"):
        estimate(config, gradient_accumulation_steps=0, **options)
