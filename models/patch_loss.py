"""The model patch's *ForCausalLM forward (models/hf_patch.py describes the patch): in a training step,
the fused linear cross-entropy on the final hidden states and lm_head's weight, with HF's
ForCausalLMLoss semantics; the logits are never made. A mixture-of-experts model's auxiliary
load-balancing loss is added as its own forward adds it (its modeling file's function, on the
routers' logits)."""

import torch

from llmk.losses.fused_linear_cross_entropy_ops import fused_linear_cross_entropy
from llmk.models.packing import IGNORE_INDEX
from llmk.models.patch_state import cache_field, count, kernel_ready


def _fused_head(head):
    """Whether the LM head is a plain nn.Linear without hooks, so that its .weight is what its
    forward would use (PEFT's LoRA, DeepSpeed ZeRO-3's gathers and FSDP act through wrappers or
    hooks, which the fused loss would bypass)."""
    return type(head) is torch.nn.Linear and not (head._forward_hooks or head._forward_pre_hooks)


def causal_lm_forward(
    model,
    original,
    state,
    input_ids=None,
    attention_mask=None,
    position_ids=None,
    inputs_embeds=None,
    labels=None,
    use_cache=None,
    logits_to_keep=0,
    **kwargs,
):
    """*ForCausalLM.forward: a training step (model.train(), grad enabled, labels, every position's
    logits) runs the base model, then the fused linear cross-entropy with HF's
    ForCausalLMLoss semantics; anything else, the original forward (module docstring). The KV
    cache, if any, stays in kwargs under the caller's name for it (cache_argument)."""

    def run_original():
        return original(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )

    every_position = isinstance(logits_to_keep, int) and logits_to_keep == 0
    # HF computes a loss only with labels (shift_labels then replace their shifted copy)
    if not (labels is not None and every_position and model.training and torch.is_grad_enabled()):
        return run_original()  # not a training step
    head = model.lm_head
    if not _fused_head(head) or torch.is_autocast_enabled(head.weight.device.type):
        # autocast would run the head's GEMM in its dtype, which the fused op's GEMMs do not follow
        count(state, "cross_entropy fallback")
        return run_original()
    from transformers.modeling_outputs import CausalLMOutputWithPast

    options = dict(kwargs)
    moe = state.moe_balance_loss is not None  # Qwen3-MoE, Mixtral: MoeCausalLMOutputWithPast
    if moe:
        router_logits = options.pop("output_router_logits", None)
        options["output_router_logits"] = model.config.output_router_logits if router_logits is None else router_logits
    num_items = options.pop("num_items_in_batch", None)
    ignore_index = options.pop("ignore_index", IGNORE_INDEX)
    shift_labels = options.pop("shift_labels", None)
    return_dict = options.pop("return_dict", None)
    as_dict = getattr(model.config, "return_dict", True) if return_dict is None else return_dict
    outputs = model.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        inputs_embeds=inputs_embeds,
        use_cache=use_cache,
        return_dict=True,
        **options,
    )
    hidden = outputs.last_hidden_state
    # HF's ForCausalLMLoss: token t predicts label t + 1 (the last position none), unless the
    # caller shifted them already (sequence parallelism, packed batches)
    target = (
        shift_labels
        if shift_labels is not None
        else torch.nn.functional.pad(labels, (0, 1), value=ignore_index)[..., 1:]
    )
    target = target.to(hidden.device)
    softcap = getattr(model.config, "final_logit_softcapping", None)  # Gemma 2's c * tanh(logits / c)
    if kernel_ready(hidden, head.weight) and head.weight.dtype == hidden.dtype and target.shape == hidden.shape[:2]:
        count(state, "cross_entropy")
        # grad_hidden may take the final hidden states' memory unless the output returns them
        loss, logits = (
            fused_linear_cross_entropy(
                hidden,
                head.weight,
                target,
                head.bias,
                ignore_index,
                "mean" if num_items is None else "sum",
                softcap=softcap,
                loss_dtype=torch.float32,
                grad_in_place=outputs.hidden_states is None,
            ),
            None,
        )
        if num_items is not None:
            loss = loss / (num_items.to(loss.device) if torch.is_tensor(num_items) else num_items)
    else:
        count(state, "cross_entropy fallback")
        logits = head(hidden)
        if softcap is not None:  # as the model's own forward caps them
            logits = torch.tanh(logits / softcap) * softcap
        loss = model.loss_function(
            logits=logits,
            labels=labels,
            vocab_size=model.config.vocab_size,
            num_items_in_batch=num_items,
            ignore_index=ignore_index,
            shift_labels=shift_labels,
        )
    cache = cache_field(outputs)
    fields = dict(
        loss=loss,
        logits=logits,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
        **{cache: getattr(outputs, cache)},
    )
    if moe:
        from transformers.modeling_outputs import MoeCausalLMOutputWithPast

        aux_loss = None
        if options["output_router_logits"]:
            aux_loss = state.moe_balance_loss(
                outputs.router_logits, model.num_experts, model.num_experts_per_tok, attention_mask
            )
            fields["loss"] = loss + model.router_aux_loss_coef * aux_loss.to(loss.device)
        out = MoeCausalLMOutputWithPast(aux_loss=aux_loss, router_logits=outputs.router_logits, **fields)
    else:
        out = CausalLMOutputWithPast(**fields)
    return out if as_dict else out.to_tuple()
