"""The update sharded across processes with PyTorch's FSDP2 (``fully_shard``): each process
holds a slice of every weight, gradient and AdamW moment, gathers a layer's weights for its
forward and backward, and reduce-scatters the gradients. ``GRPOUpdate`` runs on a sharded
model as on a whole one; the loss of each process divides by the whole batch's counts (its
responses, its tokens), so the gradients are reduced as plain sums and the update equals one
process's over the whole batch.

The process group is torch's default one (``torch.distributed.init_process_group``, as
``torchrun`` sets it up): NCCL on CUDA, gloo on the CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from llm_gym.lm.lora import unwrapped
from llm_gym.lm.tensors import selected_log_probs
from llm_gym.run.files import Recorder

__all__ = [
    "Processes",
    "all_reduce",
    "barrier",
    "broadcast_object",
    "full_weights",
    "gather_objects",
    "is_sharded",
    "join_processes",
    "launched_processes",
    "load_optimizer",
    "note",
    "peer_lost",
    "process_rank",
    "run_world",
    "save_optimizer",
    "shard_model",
    "world_size",
]


def world_size() -> int:
    """The processes of the default group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def process_rank() -> int:
    """This process's rank in the default group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def note(message: str) -> None:
    """A one-line note to stderr (``llm-gym: note: ...``), from the first process only: a run
    across processes says it once."""
    if process_rank() == 0:
        print(f"llm-gym: note: {message}", file=sys.stderr, flush=True)


def launched_processes() -> int:
    """The processes a launcher started for this job: ``torchrun``'s ``WORLD_SIZE`` (1 when
    this process was started alone)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def run_world() -> int:
    """The processes a run will have: the launcher's, or an existing group's if larger (a
    caller that joined one itself)."""
    return max(launched_processes(), world_size())


def join_processes(device: torch.device) -> tuple[torch.device, bool]:
    """Under a launcher (``launched_processes() > 1``), join torch's default process group,
    NCCL on CUDA and gloo on the CPU, unless this process has joined one already; the device
    this process computes on (``cuda:LOCAL_RANK`` on CUDA, whatever index ``device`` names:
    one GPU a process) and whether this call joined (the caller then leaves with
    ``destroy_process_group``). Alone: ``device`` and False."""
    if launched_processes() == 1 and not (dist.is_available() and dist.is_initialized()):
        return device, False
    if device.type == "cuda":  # whatever index was named: CUDA_VISIBLE_DEVICES picks GPUs
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)  # what a bare "cuda" means in this process from now on
    if dist.is_initialized():
        return device, False
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device, True


@dataclass
class Processes:
    """The processes of a run, joined once: this one's ``rank`` of ``world``, the ``device``
    it computes on, and its sub-envs, ``first_env..first_env + num_envs`` of the run's
    ``num_envs * world`` (each process plays whole groups). ``Processes.join`` joins torch's
    default group under a launcher; ``leave`` leaves it if the join did."""

    rank: int
    world: int
    device: torch.device
    num_envs: int
    joined: bool = False

    @classmethod
    def join(cls, device: torch.device, run_envs: int) -> Processes:
        """This process of the run (``join_processes``), which plays its share of the
        run's ``run_envs`` sub-envs."""
        device, joined = join_processes(device)
        world = world_size()
        return cls(process_rank(), world, device, run_envs // world, joined)

    @property
    def lead(self) -> bool:
        """Whether this is the first process: the one that writes the run's files."""
        return self.rank == 0

    @property
    def first_env(self) -> int:
        """This process's first sub-env among the run's."""
        return self.rank * self.num_envs

    @property
    def mine(self) -> slice:
        """This process's sub-envs among the run's."""
        return self.part(self.num_envs)

    def part(self, count: int) -> slice:
        """This process's ``count`` entries among the run's, every process having as many
        (its sub-envs, its episodes with their branches)."""
        return slice(self.rank * count, (self.rank + 1) * count)

    def own(self, values: list) -> list:
        """This process's part of a list over the run's sub-envs."""
        return values[self.mine]

    def leave(self) -> None:
        """Leave the process group if ``join`` joined it."""
        if self.joined:
            dist.destroy_process_group()
            self.joined = False


# What gloo's and NCCL's collectives raise when another process of the group has died: a
# plain RuntimeError with the transport's words, or one of torch's ``DistError`` kinds.
_PEER_GONE = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "communicator was aborted",
)


def peer_lost(error: BaseException) -> bool:
    """Whether ``error`` is a collective's failure because another process of the run is gone
    (killed, or stopped on its own error): what this process stops on, as on Ctrl-C.

    >>> peer_lost(RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:20916"))
    True
    >>> peer_lost(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    False
    """
    if isinstance(error, dist.DistError):
        return True
    return isinstance(error, RuntimeError) and any(words in str(error) for words in _PEER_GONE)


def barrier() -> None:
    """Wait for every process of the default group (nothing with one)."""
    if world_size() > 1:
        dist.barrier()


def broadcast_object(value: Any) -> Any:
    """The first process's ``value`` (picklable), on every process; ``value`` with one."""
    if world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(items: list) -> list:
    """Every process's ``items`` (picklable), concatenated in rank order, on every process;
    ``items`` itself with one process."""
    if world_size() == 1:
        return items
    gathered: list = [None] * world_size()
    dist.all_gather_object(gathered, items)
    return [item for part in gathered for item in part]


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``shard_model`` (or any ``fully_shard``) sharded ``model``."""
    if not dist.is_available():  # a torch built without torch.distributed shards nothing
        return False
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule) or isinstance(unwrapped(model), FSDPModule)


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` sharded in place over every process of the default group: ``fully_shard`` on
    each decoder layer (the classes the model names in ``_no_split_modules``) and on the root.
    A run's ``--precision bf16-mixed`` gathers the float32 shards and computes under the update's
    bfloat16 autocast, as one process does: FSDP's own bfloat16 parameter policy would cast
    every weight (norms too) where autocast keeps some ops in float32, so the world size
    would change the result (it did: a second epoch's loss of -0.0759 on two processes
    against -0.0865 on one, tested),
    for half the all-gather's bytes. The gradients are reduced as sums, never
    averages: ``GRPOUpdate``'s losses divide by the whole batch's counts already, and a sum
    is one on every backend (some torch versions sum FSDP2's "averaged" gradients under
    gloo)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import (
        FSDPModule,
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    if world_size() == 1 and not dist.is_initialized():
        raise RuntimeError(
            "shard_model needs torch.distributed's default process group: run under torchrun "
            "(or llm-gym train --nproc-per-node N), or call init_process_group first"
        )
    device = next(model.parameters()).device
    mesh = init_device_mesh(device.type, (world_size(),))
    policy = MixedPrecisionPolicy(reduce_dtype=torch.float32)
    blocks = set(getattr(unwrapped(model), "_no_split_modules", None) or ())
    if not blocks:
        raise ValueError(
            f"{type(unwrapped(model)).__name__} names no decoder layer (_no_split_modules): "
            "shard_model shards a transformers causal LM"
        )
    for module in list(model.modules()):
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    # The update runs the decoder and the output layer by hand (selected_log_probs), not the
    # root's forward: as a forward method of the root, the root's own weights (embedding,
    # final norm, output layer) are gathered for it and their gradients reduced after it.
    model.selected_log_probs = types.MethodType(selected_log_probs, model)
    register_fsdp_forward_method(model, "selected_log_probs")
    if unwrapped(model) is not model:
        # A peft model's generate runs the inner model's forward, not the root's: as a
        # forward method of the root, generate gathers the root's weights too.
        register_fsdp_forward_method(model, "generate")
    # transformers' mark of an FSDP2 model: its generate then steps every process until all
    # have finished (synced_gpus), so that their gathers pair; on the model that generates.
    model._is_fsdp_managed_module = True
    unwrapped(model)._is_fsdp_managed_module = True
    return model


def all_reduce(values: list[float], op: str = "sum", device: torch.device | None = None) -> list:
    """``values`` summed (``op`` "sum") or maxed ("max") over the processes of the default
    group, in float64; the values themselves with one process."""
    if world_size() == 1:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
    return tensor.tolist()


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole weights of a sharded ``model`` (a state dict of plain CPU tensors, gathered
    a tensor at a time) on the first process, None on the others; every process must call it.
    Tied weights (an output embedding tied to the input one) are one tensor under each of
    their names, as in an unsharded model's state dict, so that
    ``save_pretrained(state_dict=...)`` writes them once: the ordinary model folder that
    ``--model``, ``from_pretrained`` and vLLM load."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    if dist.get_rank() != 0:
        return None
    # Each name's gathered copy is its own tensor, and save_pretrained drops a tied
    # duplicate only when it shares storage: alias the names of one parameter again.
    first: dict[int, str] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        origin = first.setdefault(id(tensor), name)
        if origin != name and origin in weights and name in weights:
            weights[name] = weights[origin]
    return weights


def save_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike[str]
) -> None:
    """``optimizer``'s state (of ``model``'s weights, sharded or not) into ``folder`` with
    ``torch.distributed.checkpoint``: each process writes its own shards, and any number of
    processes loads it back (``load_optimizer``), DCP resharding it; every process must call
    it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
    writer = dcp.FileSystemWriter(folder)
    writer.fs = files = _recorded_files()
    with warnings.catch_warnings():  # one process without a group: what is meant here
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        try:
            dcp.save(state, storage_writer=writer)
        except CheckpointException as error:  # a BaseException: say the OSError behind it
            failed = next((r.error for r in files.recorders if r.error is not None), None)
            if failed is None:
                raise
            raise failed from error


def _recorded_files() -> Any:
    # DCP's file system, each file it writes wrapped so that a failed write's OSError is kept
    # (a class made on first use: torch.distributed.checkpoint is imported lazily).
    from torch.distributed.checkpoint.filesystem import FileSystem

    class RecordedFiles(FileSystem):
        def __init__(self) -> None:
            super().__init__()
            self.recorders: list[Recorder] = []

        @contextlib.contextmanager
        def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
            # Unbuffered: a short write reaches the recorder, which writes on to the OSError.
            with open(path, mode, buffering=0 if "w" in mode else -1) as stream:
                self.recorders.append(Recorder(stream))
                yield self.recorders[-1]

    return RecordedFiles()


def load_optimizer(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: str | os.PathLike[str]
) -> None:
    """``optimizer``'s state from ``save_optimizer``'s ``folder``, written by any number of
    processes, resharded for this run's (one process: a plain model and optimizer)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_optimizer_state_dict,
        set_optimizer_state_dict,
    )

    state = {"optimizer": get_optimizer_state_dict(model, optimizer)}  # the layout to fill
    with warnings.catch_warnings():  # one process without a group: what is meant here
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=folder)
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
