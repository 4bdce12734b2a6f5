"""The PyTorch backend: any ``nn.Module`` with a loss, or a :mod:`unitrain.models` model.

The model's state dict is the module's own: parameters and persistent buffers (BatchNorm
running statistics and counters) under their ``module.state_dict()`` names, so a checkpoint's
``model.safetensors`` loads straight into the native module with ``load_state_dict``.

Optimizers come from the table of :mod:`.optimizers`: torch's own classes where their
formulas are the reference's, ``torch._foreach`` ops in the reference's form where not.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from unitrain import ConfigError, losses, optim
from unitrain.backends.precision import require_precision
from unitrain.backends.protocol import (
    BackendOptions,
    Batch,
    Capabilities,
    UpdateNumbers,
    check_state,
    split_state,
)
from unitrain.backends.strategy import dropout_index
from unitrain.backends.torch import ops as torch_ops
from unitrain.backends.torch.core import (
    DTYPES,
    ArrayOps,
    decode,
    encode,
    make_deterministic,
    numpy_dtype,
    resolve_device,
    tensor_like,
    to_numpy,
)
from unitrain.backends.torch.kernels import device_guard, finite_check
from unitrain.backends.torch.layers import PortableModule
from unitrain.backends.torch.loops import UpdateLoops
from unitrain.backends.torch.model import batch_loss_in_ops, loss_function, structured_tensors
from unitrain.backends.torch.optimizers import optimizer_for
from unitrain.backends.torch.precision import (
    LossScale,
    MixedPrecision,
    cpu_float16_autocast,
    set_matmul_precision,
)
from unitrain.backends.torch.prefetch import prefetch
from unitrain.models import AbstractLayer, InputCheck
from unitrain.ops.random import host_stream_key
from unitrain.structure import first_leaf, is_plain_pair, map_leaves, num_examples

__all__ = ["TorchBackend", "reads_flag_on_host"]


class TorchBackend:
    """PyTorch implementation of the :class:`unitrain.backends.protocol.Backend` protocol, with the
    fused call and the multi-step and data-on-device calls of a :class:`.loops.UpdateLoops` it
    holds (``loops``)."""

    name = "torch"
    #: This backend's module of the unitrain.ops contract (the PortableOps protocol).
    ops = torch_ops
    capabilities = Capabilities(
        devices=("cpu", "gpu"),
        dtypes=("float32", "float64", "bfloat16"),
        portable_layers=True,
        data_parallel=True,
        precisions={
            "cpu": ("32", "bf16-mixed") + (("16-mixed",) if cpu_float16_autocast() else ()),
            "gpu": ("32", "bf16-mixed", "16-mixed"),
        },
    )

    @staticmethod
    def available_devices() -> tuple[str, ...]:
        """The devices torch can use on this machine."""
        return ("cpu", "gpu") if torch.cuda.is_available() else ("cpu",)

    def __init__(self, model: Any, options: BackendOptions | None = None) -> None:
        self.options = options = optim.bind_options(options or BackendOptions(), model)
        self.torch_device = resolve_device(options.device)
        if options.dtype not in DTYPES:
            raise ConfigError(f"the torch backend trains in {tuple(DTYPES)}, got {options.dtype!r}")
        self.dtype = DTYPES[options.dtype]
        device_kind = "gpu" if self.torch_device.type == "cuda" else "cpu"
        require_precision(
            self.name, self.capabilities.precisions[device_kind], options.precision, device_kind
        )
        if options.deterministic:
            make_deterministic(self.torch_device)
        set_matmul_precision(options.matmul_precision)
        self._mixed = MixedPrecision(options, self.torch_device)
        self.loss_scale = LossScale(options)
        torch.manual_seed(options.seed)
        if isinstance(model, AbstractLayer):
            self.module: nn.Module = PortableModule(
                model, options.seed, self.dtype, self.torch_device, self.ops
            )
        elif isinstance(model, nn.Module):
            self.module = model
        else:
            raise ConfigError(
                "the torch backend trains an nn.Module or a unitrain.models layer, "
                f"got {type(model).__name__}"
            )
        self.module.to(self.torch_device, self.dtype).train()
        self.params = dict(self.module.named_parameters())
        self._forward_module = self.module  # DDP's wrapper when data-parallel (distribute)
        self._input_check = InputCheck(model) if isinstance(model, AbstractLayer) else None
        self._tokens = self._input_check is not None and self._input_check.tokens
        self.loss_fn, self.classification = loss_function(options.loss)
        #: Whether float targets go to the loss in the parameters' dtype (a native callable
        #: gets them as they come).
        self._float_targets = isinstance(losses.resolve_loss(options.loss), losses.AbstractLoss)
        #: The loss as data, and whether it reads the whole batch (an objective): every
        #: batch then goes the structured way (see :meth:`_tensors`).
        self._loss_object = losses.resolve_loss(options.loss)
        self._reads_batch = bool(getattr(self._loss_object, "reads_batch", False))
        self.optimizer = optimizer_for(options.optimizer, self.params)
        self._loss: torch.Tensor | None = None  # the last forward's, until backward
        self._step = 0  # updates applied: the optimizer's step
        self._numbers = UpdateNumbers()  # the dropout key's (step, micro_batch)
        self.loops = UpdateLoops(self._tensors, self._update_on, self._numbers)
        self._worker = (1, 0)  # (world size, rank): numbers this worker's dropout keys
        self._skipped = 0
        # CPU float32/float64 batches from numpy are used as they are (torch.from_numpy).
        self._host_batches = self.torch_device.type == "cpu" and self.dtype != torch.bfloat16
        self._numpy_dtype = numpy_dtype(self.dtype)
        self._all_finite = finite_check(self.torch_device, self.dtype)
        native = self.optimizer.native
        on_host = reads_flag_on_host(self.torch_device, self.loss_scale.active, native)
        self._guard = None if on_host else device_guard(native, options.grad_clip_norm)

    @property
    def device(self) -> str:
        """``"gpu"`` on CUDA, else ``"cpu"``."""
        return "gpu" if self.torch_device.type == "cuda" else "cpu"

    @property
    def skipped_steps(self) -> int:
        """Updates skipped because a gradient was not finite."""
        self._settle()
        return self._skipped

    def _settle(self) -> None:
        """Take in the updates the device guard skipped since the last call (one read)."""
        if self._guard is not None:
            skipped = self._guard.take_skipped()
            self._skipped += skipped
            self._step -= skipped

    def prefetch(self, batches: Iterable[Batch]) -> Iterable[Batch]:
        """On CUDA, each batch pinned and copied on a side stream while the previous one
        trains (see :mod:`.prefetch`); on the CPU, ``batches`` unchanged."""
        inputs = torch.int64 if self._tokens else self.dtype  # token ids stay ids
        return prefetch(batches, self.torch_device, inputs, self.classification)

    def _tensors(self, batch: Batch) -> tuple[Any, Any]:
        """``(x, y)`` as tensors; for a structured batch, an objective or sample weights,
        ``(inputs, losses.BatchView)`` (see :func:`.model.structured_tensors`)."""
        if self._reads_batch or not is_plain_pair(batch):
            if self._input_check is not None:
                self._input_check(batch[0])
            return structured_tensors(batch, self.torch_device, self.dtype)
        x, y = batch
        if self._input_check is not None:
            self._input_check(x)
        if self._tokens:
            x = torch.as_tensor(x).to(self.torch_device, torch.int64)
        elif self._host_batches and type(x) is np.ndarray and x.dtype == self._numpy_dtype:
            x = torch.from_numpy(x)  # the common case: no conversion, no copy, no dispatch
        else:
            x = torch.as_tensor(x).to(self.torch_device, self.dtype, non_blocking=True)
        if self._host_batches and type(y) is np.ndarray:
            y = torch.from_numpy(y)
        else:
            y = torch.as_tensor(y).to(self.torch_device, non_blocking=True)
        if self.classification:
            if y.dtype != torch.int64:
                y = y.long()
        elif self._float_targets and y.is_floating_point():
            y = y.to(self.dtype)
        return x, y

    def _compute_loss(self, out: Any, y: Any) -> torch.Tensor:
        """The loss of ``out``, in the parameters' dtype (float32 under mixed precision),
        plus the loss terms the model's layers reported in the pass."""
        terms = self.module.__dict__.get("reported_losses")  # a PortableModule's
        if terms or type(y) is losses.BatchView:
            if type(y) is not losses.BatchView:
                y = losses.BatchView(None, y)
            return batch_loss_in_ops(self._loss_object, out, y, terms or (), self.dtype)
        if out.dtype != self.dtype and out.is_floating_point():
            out = out.to(self.dtype)
        return self.loss_fn(out, y)

    def forward(
        self, batch: Batch, *, step: int | None = None, micro_batch: int | None = None
    ) -> Any:
        """Train-mode forward; returns the loss detached from the graph (no host sync)."""
        key = self._numbers.forward(step, micro_batch)
        return self._forward_tensors(*self._tensors(batch), key)

    def train_step(self, batch: Batch, lr: float, *, step: int | None = None) -> torch.Tensor:
        """``forward(batch, step=step, micro_batch=0); backward(); step(lr)``; returns the
        loss (no host sync)."""
        loss = self.forward(batch, step=step, micro_batch=0)
        self.backward()
        self.step(lr)
        return loss

    def train_steps(self, batches: Batch, lrs: Any, *, step: int | None = None) -> torch.Tensor:
        """``k`` updates, equal to ``k`` :meth:`train_step` calls (see :class:`.UpdateLoops`)."""
        return self.loops.train_steps(batches, lrs, step=step)

    def set_device_data(self, inputs: Any, targets: Any) -> None:
        """Put a whole training set on the device once, for :meth:`train_steps_on_device`."""
        self.loops.set_device_data(inputs, targets)

    def train_steps_on_device(
        self, indices: Any, lrs: Any, *, step: int | None = None
    ) -> torch.Tensor:
        """``k`` updates on batches gathered by index from the device's training set."""
        return self.loops.train_steps_on_device(indices, lrs, step=step)

    def _update_on(
        self, x: torch.Tensor, y: torch.Tensor, lr: float, key: tuple[int, int]
    ) -> torch.Tensor:
        """One update on converted tensors, dropout keyed by ``key``; returns the loss."""
        loss = self._forward_tensors(x, y, key)
        self.backward()
        self.step(lr)
        return loss

    def _forward_tensors(
        self, x: torch.Tensor, y: torch.Tensor, key: tuple[int, int]
    ) -> torch.Tensor:
        """The train-mode loss of ``(x, y)``, dropout seeded by ``key``: ``(step,
        micro_batch)``."""
        if not self.module.training:
            self.module.train()
        generator = getattr(self.module, "generator", None)
        if generator is not None:
            step, micro_batch = key
            micro = dropout_index(micro_batch, *self._worker)
            if self.options.random == "portable":  # the key on the host, the draws on device
                module: Any = self.module  # a PortableModule: it has a generator
                module.stream_key = host_stream_key(self.options.seed, step, micro)
            else:
                seed = hash((self.options.seed, step, micro)) & (2**63 - 1)
                generator.manual_seed(seed)
        with self._mixed.autocast():
            out = self._forward_module(x)
            self._loss = self._compute_loss(out, y)
        return self._loss.detach()

    def distribute(self, wrap: Any, world_size: int, rank: int) -> None:
        """Run train-mode forwards through ``wrap(module)`` (DDP), which syncs gradients, and
        key dropout as worker ``rank`` of ``world_size`` (see ``strategy.dropout_index``)."""
        self._forward_module = wrap(self.module)
        self._worker = (world_size, rank)

    def shard(self, shard_module: Any, world_size: int, rank: int) -> None:
        """Split parameters, gradients and optimizer state over the workers:
        ``shard_module(module)`` (FSDP2's ``fully_shard``) makes the parameters sharded in
        place, the optimizer is rebuilt over them, and the finite check is taken over every
        worker's shards (see :mod:`.sharding`). Dropout is keyed as worker ``rank``."""
        from unitrain.backends.torch.sharding import global_finite_check

        if self._step:
            raise ConfigError("shard the model before its first update (Trainer does)")
        shard_module(self.module)
        self.params = dict(self.module.named_parameters())
        self.optimizer = optimizer_for(self.options.optimizer, self.params)
        self._all_finite = global_finite_check(self._all_finite)
        self._guard = None  # the device guard's skip flag would be this worker's alone
        self._worker = (world_size, rank)

    @staticmethod
    def sharded_strategy(workers: int | None) -> Any:
        """FSDP2 over the workers torchrun started (see :mod:`.sharding`)."""
        from unitrain.backends.torch.sharding import TorchSharded

        return TorchSharded.for_request(workers)

    def launched_strategy(self) -> Any:
        """DDP over the workers torchrun started, or None when it did not start this one."""
        from unitrain.backends.torch.distributed import TorchDDP

        return TorchDDP.from_environment()

    @staticmethod
    def launch_command(workers: int) -> list[str]:
        """The launcher that starts ``workers`` local workers (torch.distributed.run)."""
        from unitrain.backends.torch.distributed import launch_command

        return launch_command(workers)

    def backward(self, scale: float = 1.0) -> None:
        """Add ``scale`` times the gradients of the last loss to ``.grad``.

        A non-finite loss makes every gradient NaN, so the update is skipped as for a
        non-finite gradient (a float32 mse can overflow to inf while its gradient stays
        finite): the loss is multiplied by ``loss * 0 + 1``, detached, which is exactly 1.0
        for a finite loss and NaN otherwise. Two scalar ops, no host sync.
        """
        scale = self.loss_scale.multiplier(scale)
        if (loss := self._loss) is None:
            raise ConfigError("backward() needs a forward() first; each loss is used once")
        loss = loss * (loss.detach() * 0 + 1)
        (loss if scale == 1.0 else loss * scale).backward()
        self._loss = None

    def step(self, lr: float) -> None:
        """Clip, skip on non-finite gradients, update at ``lr``, zero the gradients."""
        grads = [p.grad for p in self.params.values() if p.grad is not None]
        if self._guard is not None and grads:  # decided on the device, counted when read
            self._guard.check(grads)
            self._update(lr)
            return
        self.loss_scale.unscale(grads)
        finite = not grads or self._gradients_finite(grads)
        self.loss_scale.advance(torch.tensor(finite))
        if not finite:
            self._skipped += 1
            self.optimizer.zero_grad()
            self._numbers.updated()
            return
        self._update(lr)

    def _update(self, lr: float) -> None:
        self._step += 1
        self.optimizer.step(lr, self._step)
        self.optimizer.zero_grad()
        self._numbers.updated()

    def _gradients_finite(self, grads: list[torch.Tensor]) -> bool:
        """Clip ``grads`` in place if configured; return whether they are all finite.

        Without clipping, the check is the cheapest one this device and dtype support (see
        :func:`.kernels.finite_check`). The host guard, for runs whose next step needs the
        outcome (dropout seeds, the loss scale) or whose kernel cannot skip on a device flag:
        on CPU the read of the flag costs nothing; on CUDA it is a sync per step, which the
        device guard (:class:`.kernels.DeviceGuard`) avoids.
        """
        clip = self.options.grad_clip_norm
        if clip is None:
            return self._all_finite(grads)
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if not bool(torch.isfinite(norm)):
            return False
        torch._foreach_mul_(grads, torch.clamp(clip / (norm + optim.CLIP_EPSILON), max=1.0))
        return True

    def to_host(self, values: list[torch.Tensor]) -> list[np.ndarray]:
        """Many device values (losses) read back to the host in one transfer, in their dtype
        (bfloat16 as float32, which holds it exactly)."""
        if all(v.shape == values[0].shape for v in values):
            return list(to_numpy(torch.stack(values)))
        return [to_numpy(v) for v in values]

    def evaluate(self, batch: Batch) -> dict[str, Any]:
        """Eval-mode metrics (no dropout, frozen norm statistics, no gradients)."""
        x, y = self._tensors(batch)
        self.module.eval()
        with torch.no_grad(), self._mixed.autocast():
            out = self.module(x)
            metrics = {"loss": self._compute_loss(out, y)}
            if self.classification:  # the first output against the first target
                out, y = first_leaf(out), first_leaf(_targets(y))
                hits = out.argmax(dim=-1) == y.reshape(out.shape[:-1])
                metrics["accuracy"] = hits.to(torch.float32).mean()
        return metrics

    def predict(self, inputs: Any) -> np.ndarray:
        """The model's outputs for ``inputs`` in eval mode, on the host."""
        rows = num_examples((inputs,))
        x, _ = self._tensors((inputs, np.zeros(rows, np.int64)))  # token ids stay ints
        self.module.eval()
        with torch.no_grad(), self._mixed.autocast():
            return map_leaves(lambda out: to_numpy(out.to(self.dtype)), self.module(x))

    #: The array functions metrics use (see :meth:`outputs`).
    array_ops = ArrayOps

    def outputs(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Eval-mode outputs and the targets as tensors on the device, for metrics."""
        x, y = self._tensors(batch)
        self.module.eval()
        with torch.no_grad(), self._mixed.autocast():
            return map_leaves(lambda out: out.to(self.dtype), self.module(x)), _targets(y)

    # -- state -------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, buffers and optimizer state as host numpy copies, canonical names."""
        return self._state(to_numpy)

    def local_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` with each tensor sharded by rows as this worker's rows of it (a
        :class:`~unitrain.checkpoint.RowShard`), read without gathering: what a sharded
        checkpoint stores (see :func:`.sharding.local_rows`)."""
        from unitrain.backends.torch.sharding import local_rows

        return self._state(local_rows)

    def _state(self, host: Any) -> dict[str, Any]:
        """The state, each tensor read by ``host`` (a full or a local copy)."""
        state = {f"model.{k}": host(v) for k, v in self._model_tensors().items()}
        owners = {f"{k}.": v for k, v in self.params.items()}
        slot_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        for key, tensor in self.optimizer.slots().items():
            if tensor is None:  # not created yet: zeros shaped (and sharded) as its parameter
                param = next(p for prefix, p in owners.items() if key.startswith(prefix))
                tensor = torch.zeros_like(param, dtype=slot_dtype)
            state[f"optimizer.{key}"] = host(tensor)
        self._settle()
        state["optimizer.step"] = np.asarray(self._step, np.int64)
        state.update({f"optimizer.{k}": v for k, v in self.loss_scale.state().items()})
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Copy parameters, buffers and optimizer state in; names and shapes must match exactly."""
        check_state(self.state_dict(), state)
        model, opt = split_state(state)
        self._settle()  # what was skipped before the load stays counted as skipped
        self._step = int(opt.pop("step"))
        self.loss_scale.load(opt)
        with torch.no_grad():
            for name, tensor in self._model_tensors().items():
                tensor.copy_(tensor_like(model[name], tensor))  # sharded when the tensor is
        self.optimizer.load_slots(opt, self._step)
        self._numbers.loaded(self._step)

    def _model_tensors(self) -> dict[str, torch.Tensor]:
        """Parameters and persistent buffers under their state-dict names, in the module's
        order; read each time, as a forward may replace a buffer (a portable model's moved
        state, a native module's ``self.h = h.detach()``)."""
        return self.module.state_dict(keep_vars=True)

    def rng_state(self) -> dict[str, Any]:
        """torch's global CPU (and CUDA) generator states, base64-encoded."""
        state = {"cpu": encode(torch.get_rng_state())}
        if self.torch_device.type == "cuda":
            state["cuda"] = encode(torch.cuda.get_rng_state(self.torch_device))
        return state

    def set_rng_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`rng_state` returned."""
        if "cpu" in state:
            torch.set_rng_state(decode(state["cpu"]))
        if "cuda" in state and self.torch_device.type == "cuda":
            torch.cuda.set_rng_state(decode(state["cuda"]), self.torch_device)

    def versions(self) -> dict[str, str]:
        """torch's version (and CUDA's when used)."""
        versions: dict[str, str] = {"torch": torch.__version__}
        if self.torch_device.type == "cuda" and torch.version.cuda:
            versions["cuda"] = torch.version.cuda
        return versions


def reads_flag_on_host(
    device: torch.device,
    scaled: bool,
    native: torch.optim.Optimizer | None,
) -> bool:
    """Whether a step reads its non-finite flag on the host rather than skip on the device.

    On the CPU the read costs nothing (and the device guard's extra ops ~5 % of a small step);
    the fp16 loss scale needs each step's outcome before the next one; and only torch's own
    optimizers (``native``) have fused kernels that skip on a flag. Dropout does not: its
    keys are numbered by the caller (skipped updates included), not by applied updates.
    """
    return device.type == "cpu" or scaled or native is None


def _targets(y: Any) -> Any:
    """The targets of what :meth:`TorchBackend._tensors` gave: ``y`` or the view's."""
    return y.targets if type(y) is losses.BatchView else y
