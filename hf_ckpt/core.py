"""``enable`` / ``disable``: activation checkpointing on any loaded model, without subclassing: the public layer.

:func:`configure` is the one enable path every entry point shares: :func:`hf_ckpt.enable`, the
:class:`~hf_ckpt.GradientCheckpointingMixin` methods and the methods :func:`hf_ckpt.patch_transformers` puts on
``PreTrainedModel`` (so the stock ``Trainer``, TRL and sentence-transformers too). The life of one call:

1. **Validate.** The arguments become one :class:`~hf_ckpt.runtime.request.EnableRequest` (parsed once, bad values
   fail here, naming the argument), holding one :class:`~hf_ckpt.CheckpointConfig`; a request with a ``budget``
   goes to the lab (:mod:`hf_ckpt.budget.deferred`: a plan made now on ``sample_inputs``, or at the first training
   batch), which makes the plan and comes back through the same runtime function. A call that raises changes nothing.
2. **Apply** (:func:`hf_ckpt.runtime.apply.install`, the runtime, for every entry point): resolve the config on the
   model without touching it (an index past the last block fails here), take back a previous hf_ckpt setting, bind
   the flags and functions, add the hooks (input grads, ``use_cache`` off in training steps, checkpointing off under
   ``no_grad``, the distributed guard, the probe that measures what the first step recomputes), record it all.

``disable`` puts back exactly what the record says the model had before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from torch import nn

from hf_ckpt.runtime.apply import apply_request, remove
from hf_ckpt.runtime.apply import checkpointed_layers as _measured_or_flagged
from hf_ckpt.runtime.request import EnableRequest

if TYPE_CHECKING:
    from hf_ckpt.runtime.plans import CheckpointPlan


def configure(model: nn.Module, kwargs_dict: Mapping[str, Any] | None, dict_name: str, **options: Any) -> nn.Module:
    """Enable checkpointing on ``model`` from a ``gradient_checkpointing_enable``-style call: hf_ckpt's options as
    ``options`` or as keys of ``kwargs_dict`` (named ``dict_name`` in errors), the rest for
    ``torch.utils.checkpoint.checkpoint``. The one path of :func:`enable`, the mixin and the patch: the arguments
    become one :class:`~hf_ckpt.runtime.request.EnableRequest`, read by nothing else."""
    request = EnableRequest.parse(kwargs_dict, dict_name, **options)
    if request.budget is None:
        return apply_request(model, request)
    from hf_ckpt.budget import deferred as _deferred  # deferred: the lab (planner, estimator) loads only when a budget is asked for

    return _deferred.enable_within(model, request)


def enable(
    model: nn.Module,
    *,
    every_n_layers: int = 1,
    layers: Sequence[int] | None = None,
    num_layers: int | None = None,
    method: str | None = None,
    strategy: str = "full",
    policy: Any = None,
    plan: "CheckpointPlan | str | None" = None,
    budget: float | int | str | None = None,
    sample_inputs: Mapping[str, Any] | None = None,
    keep_outputs: bool = False,
    offload: bool = False,
    checkpoint_fn: Any = None,
    head_chunk_size: int | None = None,
    mlp_chunk_size: int | None = None,
    **checkpoint_kwargs: Any,
) -> nn.Module:
    """Enable activation checkpointing on a loaded model, without subclassing it.

    Works on a ``transformers.PreTrainedModel`` of any supported release (4.45 to 5.x), layer-flag and stack-flag
    models alike, remote-code models with the legacy ``_set_gradient_checkpointing(module, value)`` signature
    included, and on the wrappers users hold (PEFT ``PeftModel``, DDP, FSDP, ...). Calling it again replaces the
    previous setting. Every option is validated before the model is touched: a call that raises changes nothing.

    Which blocks (give at most one way; blocks are the repeated per-layer blocks in global order, encoder blocks
    then decoder blocks):

    Args:
        model: The model, in any state; checkpointing takes effect in training mode with grad enabled (under
            ``torch.no_grad`` the model runs exactly as without checkpointing).
        every_n_layers: Checkpoint blocks ``0, n, 2n, ...``. ``1`` (the default) checkpoints every block.
        layers: Explicit block indices, e.g. ``[0, 1, 5]``.
        num_layers: Checkpoint this many blocks, placed by ``method``: ``"uniform"`` (spread evenly, default)
            or ``"block"`` (the first ``num_layers``).
        method: See ``num_layers``.
        strategy: ``"full"`` recomputes each selected block; ``"selective"`` keeps the outputs of its matmuls and
            attention and recomputes only the cheap ops in between (see :mod:`hf_ckpt.strategies.selective.policy`).
        policy: The selective policy: a name, a list of aten ops to save, or a callable.
        plan: A :class:`~hf_ckpt.CheckpointPlan` (or the path of one saved as JSON, ``str`` or ``os.PathLike``):
            a strategy per block.
        budget: Make the cheapest plan that fits this activation-memory budget and apply it. Bytes (int, or a
            string with a unit: ``"512MiB"``), a fraction of the no-checkpointing activation memory (float in
            ``(0, 1]``, or ``"50%"``), or, without ``sample_inputs``, ``"auto"`` (the device's free memory minus
            a headroom, see :mod:`hf_ckpt.budget.forms`). With ``sample_inputs`` the plan is profiled on that batch
            now; without, it is estimated from the first training batch's shapes just before that step runs,
            logged, and re-made when a later batch is larger (see :mod:`hf_ckpt.budget.deferred`). Either way, where no
            plan of the blocks fits, a causal LM's plan may run its head in chunks (``head_chunk_size``, chosen
            by :func:`hf_ckpt.runtime.head.default_chunk_size`).
        sample_inputs: A representative batch (a dict of the model's keyword arguments) for ``budget``'s
            profiling step.
        keep_outputs: With ``budget`` and no ``sample_inputs``: plan for a loop that keeps the model's outputs
            (logits, ...) alive through backward (``outputs = model(**batch); backward(outputs.loss)``) instead of
            the ``Trainer``'s step, which keeps only the loss (see :func:`hf_ckpt.estimation.estimate`).
        offload: Keep the inputs saved for the recompute in pinned host memory. Without an accelerator there is
            nothing to offload: plain checkpointing runs and one warning says so.
        checkpoint_fn: Checkpoint the selected blocks with this function instead of
            ``torch.utils.checkpoint.checkpoint``: any function with its calling convention,
            ``checkpoint_fn(function, *args, **kwargs)``, e.g. ``deepspeed.checkpointing.checkpoint``. It gets the
            checkpoint keyword arguments its signature names, and refuses the others, ``offload``,
            ``strategy="selective"`` and ``context_fn`` with an error at the call. Input grads are turned on (as
            for reentrant checkpointing), so weights inside a block get gradients whatever the function does.
        head_chunk_size: For a causal LM (``*ForCausalLM`` computing its loss with ``self.loss_function``): in a
            training step with ``labels``, run the output projection and the loss over this many tokens at a
            time, each chunk checkpointed (non-reentrant), so the full logits are never held; the output then has
            ``loss`` and ``logits=None``. Without labels, in eval mode or under ``no_grad``: full logits, as
            before. A model whose forward changes the logits or the loss its own way is refused at the call.
        mlp_chunk_size: Run every block's MLP (its ``mlp``, ``feed_forward`` or ``ffn`` child) over this many
            tokens at a time (batch and sequence flattened), each chunk checkpointed (non-reentrant), so only one
            chunk's intermediate activations are alive at once; gradients are exact. Under ``no_grad`` the MLP runs
            unchunked. A block without such a child, or whose MLP is not position-wise (experts and routers,
            convolutions or shifts along the sequence), is refused at the call (see :mod:`hf_ckpt.runtime.mlp_chunks`).
        **checkpoint_kwargs: Passed to ``torch.utils.checkpoint.checkpoint`` (``use_reentrant``,
            ``preserve_rng_state``, ``context_fn``, ``determinism_check``, ``debug``, ...), their values checked.
            ``use_reentrant`` defaults to ``False`` and is always passed explicitly.

    Returns:
        ``model``, so that calls chain.

    Raises:
        TypeError: ``model`` is no ``PreTrainedModel`` (or wrapper of one); an option has the wrong type; a
            checkpoint keyword argument is unknown to ``torch.utils.checkpoint.checkpoint``.
        ValueError: an option is out of range (``every_n_layers`` below 1, a layer index past the last block),
            two options select blocks in different ways, or the model's class sets
            ``supports_gradient_checkpointing = False``.

    What was recomputed is measured, not assumed: the first training step counts which blocks backward reran.
    Where that differs from the selection (model code that checkpoints by itself, or never), one warning says so
    and :func:`checkpointed_layers` reports the measured blocks from then on.

    Adapters: input grads are turned on where the recompute needs them (reentrant checkpointing, PEFT adapters),
    for the input embeddings of every tower, so LoRA weights get gradients whichever order the model was wrapped
    and enabled in.
    """
    return configure(
        model, checkpoint_kwargs, "checkpoint_kwargs", every_n_layers=every_n_layers, layers=layers,
        num_layers=num_layers, method=method, strategy=strategy, policy=policy, plan=plan, budget=budget,
        sample_inputs=sample_inputs, keep_outputs=keep_outputs, offload=offload, checkpoint_fn=checkpoint_fn,
        head_chunk_size=head_chunk_size, mlp_chunk_size=mlp_chunk_size,
    )


def disable(model: nn.Module) -> nn.Module:
    """Disable activation checkpointing and restore the model as it was before :func:`enable`.

    The flags, functions and hooks hf_ckpt set are taken back to what the model had before: if upstream's
    ``gradient_checkpointing_enable`` had turned checkpointing on before :func:`enable`, it is on again, exactly as
    upstream left it. A model hf_ckpt never set up is simply switched off (as ``gradient_checkpointing_disable``
    does upstream).
    """
    return remove(model)


def checkpointed_layers(model: nn.Module) -> list[int]:
    """Indices of the repeated blocks that will be recomputed in backward, in global order.

    Blocks are counted as :func:`hf_ckpt.enable`'s ``every_n_layers`` counts them: encoder blocks, then decoder
    blocks. Once a training step ran after :func:`hf_ckpt.enable`, this is what that step *measured*; before it,
    what the flags and checkpoint wrappers say. Works whoever enabled checkpointing (hf_ckpt, upstream
    ``gradient_checkpointing_enable``, the model's legacy ``_set_gradient_checkpointing``, ``torch.distributed``'s
    ``checkpoint_wrapper``).
    """
    return _measured_or_flagged(model)
