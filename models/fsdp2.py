"""FSDP2 sharding of a transformers causal LM, as the FSDP2 test and benchmark use it: patch first
(models/hf_patch.py), then shard; run one process a GPU under torchrun."""

import torch

from llmk.common.device import DEVICE


def rank_device():
    """This rank's device: its current CUDA device, or the CPU (gloo ranks in Triton's interpreter)."""
    return torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")


def shard(model):
    """fully_shard each decoder layer, then the root (embedding, final norm, lm_head), over every
    rank of the default process group; returns the model."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(rank_device().type, (torch.distributed.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model
