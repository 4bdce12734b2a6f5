"""The PyTorch adapter: native modules, devices, dtypes, state exchange with the reference."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from unitrain import ConfigError, Trainer, TrainerConfig, models, ops, optim, schedules  # noqa: E402
from unitrain.backends.numpy import NumpyBackend  # noqa: E402
from unitrain.backends.protocol import BackendOptions  # noqa: E402
from unitrain.backends.torch import TorchBackend, TorchMLP  # noqa: E402
from unitrain.backends.torch.backend import reads_flag_on_host  # noqa: E402
from unitrain.backends.torch.kernels import device_guard  # noqa: E402
from unitrain.backends.torch.layers import PortableModule  # noqa: E402
from unitrain.training._run_state import model_description  # noqa: E402

MODEL = models.MLP((6, 10, 3))


def data(n=48, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    return x, x[:, :3].argmax(axis=1).astype(np.int64)  # linearly separable


def test_a_native_module_with_a_native_loss_trains():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    loss = lambda out, y: torch.nn.functional.cross_entropy(out, y.long())  # noqa: E731
    trainer = Trainer(
        module,
        backend="torch",
        loss=loss,
        optimizer=optim.Adam(),
        schedule=schedules.Constant(0.01),
        config=TrainerConfig(epochs=15, batch_size=16, device="cpu"),
    )
    history = trainer.fit(data())
    assert history[-1]["loss"] < 0.5 * history[0]["loss"]
    assert "model.0.weight" in trainer.backend.state_dict()
    assert model_description(trainer.model) == {"type": "native", "class": "Sequential"}


def test_gpu_without_cuda_is_a_clear_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="no CUDA device"):
        TorchBackend(MODEL, BackendOptions(device="gpu"))
    assert TorchBackend.available_devices() == ("cpu",)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (BackendOptions(dtype="int8"), "trains in"),
        (BackendOptions(loss="hinge"), "unknown loss"),
        (BackendOptions(device="tpu"), "unknown device"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        TorchBackend(MODEL, options)


def test_not_a_model_is_refused():
    with pytest.raises(ConfigError, match=r"nn\.Module"):
        TorchBackend(object(), BackendOptions())
    with pytest.raises(ConfigError, match="architectures only"):
        NumpyBackend(object(), BackendOptions())
    with pytest.raises(ConfigError, match="'cpu' only"):
        NumpyBackend(MODEL, BackendOptions(device="gpu"))


@pytest.mark.parametrize("spec", [optim.SGD(momentum=0.9), optim.Adam(), optim.AdamW()])
def test_state_is_exchangeable_with_the_numpy_reference(spec):
    """Keys, shapes and dtypes match; a state moves both ways and training goes on alike."""
    x, y = data()
    options = BackendOptions(optimizer=spec, device="cpu")
    ours, reference = TorchBackend(MODEL, options), NumpyBackend(MODEL, options)
    for backend in (ours, reference):
        for i in range(3):
            backend.forward((x[i * 16 : (i + 1) * 16], y[i * 16 : (i + 1) * 16]))
            backend.backward()
            backend.step(0.05)
    a, b = ours.state_dict(), reference.state_dict()
    assert {k: (v.shape, v.dtype) for k, v in a.items()} == {
        k: (v.shape, v.dtype) for k, v in b.items()
    }
    fresh_torch, fresh_numpy = TorchBackend(MODEL, options), NumpyBackend(MODEL, options)
    fresh_torch.load_state_dict(b)
    fresh_numpy.load_state_dict(a)
    for key, value in fresh_torch.state_dict().items():
        np.testing.assert_array_equal(value, b[key])  # load -> save is bit-exact
    for backend in (fresh_torch, reference):
        backend.forward((x, y))
        backend.backward()
        backend.step(0.05)
    for key, value in reference.state_dict().items():
        np.testing.assert_allclose(fresh_torch.state_dict()[key], value, rtol=1e-5, atol=1e-6)


def test_load_refuses_a_state_of_another_shape():
    other = TorchBackend(models.MLP((6, 11, 3)), BackendOptions()).state_dict()
    with pytest.raises(ConfigError, match=r"shape mismatches.*layers\.0\.weight"):
        TorchBackend(MODEL, BackendOptions()).load_state_dict(other)
    with pytest.raises(ConfigError, match="missing keys"):
        TorchBackend(MODEL, BackendOptions(optimizer=optim.Adam())).load_state_dict(
            TorchBackend(MODEL, BackendOptions()).state_dict()
        )


@pytest.mark.parametrize("dtype", ["float64", "bfloat16"])
def test_other_dtypes_train(dtype):
    trainer = Trainer(
        MODEL,
        backend="torch",
        optimizer=optim.Adam(),
        schedule=schedules.Constant(0.01),
        config=TrainerConfig(epochs=5, batch_size=16, dtype=dtype, device="cpu"),
    )
    history = trainer.fit(data())
    assert history[-1]["loss"] < history[0]["loss"]
    assert trainer.backend.params["layers.0.weight"].dtype == getattr(torch, dtype)


def test_deterministic_mode_and_rng_state_round_trip():
    backend = TorchBackend(MODEL, BackendOptions(deterministic=True))
    assert torch.are_deterministic_algorithms_enabled()
    saved = backend.rng_state()
    first = torch.rand(3)
    backend.set_rng_state(saved)
    assert torch.equal(torch.rand(3), first)
    assert backend.versions()["torch"] == torch.__version__


def test_dropout_masks_depend_on_step_not_on_history():
    """The same (seed, step, micro-batch) draws the same mask, however we got there."""
    x, y = data()
    model = models.MLP((6, 10, 3), dropout=0.5)
    a = TorchBackend(model, BackendOptions(device="cpu"))
    b = TorchBackend(model, BackendOptions(device="cpu"))
    loss_a = a.forward((x, y))
    torch.rand(100)  # disturbing the global generator changes nothing
    loss_b = b.forward((x, y))
    assert torch.equal(loss_a, loss_b)
    a.backward()
    a.step(0.0)  # lr 0: same weights, next step
    assert not torch.equal(a.forward((x, y)), loss_b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_updates_in_one_call_and_on_device_data_equal_single_steps_bit_for_bit(dtype):
    """train_steps and train_steps_on_device run the same eager updates as train_step, and
    train_step the same as forward, backward and step: on the CPU, the same bits."""
    x, y = data()
    model = models.MLP((6, 10, 3), dropout=0.25)

    def fresh() -> TorchBackend:
        return TorchBackend(
            model, BackendOptions(device="cpu", dtype=dtype, optimizer=optim.Adam())
        )

    rows, lrs = (
        np.random.default_rng(3).permutation(48)[:40].reshape(5, 8),
        [0.1, 0.05, 0.02, 0.1, 0.03],
    )
    plain, fused, stacked, on_device = fresh(), fresh(), fresh(), fresh()
    expected = []
    for row, lr in zip(rows, lrs):
        expected.append(plain.forward((x[row], y[row])))
        plain.backward()
        plain.step(lr)
    fused_losses = torch.stack(
        [fused.train_step((x[row], y[row]), lr) for row, lr in zip(rows, lrs)]
    )
    stacked_losses = stacked.train_steps((x[rows], y[rows]), np.asarray(lrs))
    on_device.set_device_data(x, y)
    device_losses = on_device.train_steps_on_device(rows, np.asarray(lrs))
    assert stacked_losses.dtype == device_losses.dtype == torch.float32  # numpy reads them
    for losses in (fused_losses, stacked_losses, device_losses):
        assert torch.equal(losses.float(), torch.stack(expected).float())
    for backend in (fused, stacked, on_device):
        state = backend.state_dict()
        assert all(np.array_equal(state[k], v) for k, v in plain.state_dict().items())


def test_data_on_device_refuses_what_it_cannot_gather():
    backend = TorchBackend(MODEL, BackendOptions(device="cpu"))
    with pytest.raises(ConfigError, match="needs set_device_data"):
        backend.train_steps_on_device(np.zeros((1, 4), np.int64), [0.1])
    backend.set_device_data(*data())
    with pytest.raises(ConfigError, match=r"integers of shape \(updates, batch_size\)"):
        backend.train_steps_on_device(np.zeros((1, 4)), [0.1])
    with pytest.raises(ConfigError, match="shape"):
        backend.train_steps_on_device(np.zeros(4, np.int64), [0.1])


def test_to_host_keeps_the_loss_dtype():
    # A float64 run's losses must reach the running total in float64, not rounded to float32.
    backend = TorchBackend(models.MLP((4, 8, 3)), BackendOptions(dtype="float64"))
    x = np.random.default_rng(0).normal(size=(8, 4))
    loss = backend.forward((x, np.arange(8) % 3))
    backend.backward()
    stacked, single = backend.to_host([loss, loss]), backend.to_host([loss, loss[None]])
    assert stacked[0].dtype == np.float64 and float(stacked[0]) == float(loss.item())
    assert single[0].dtype == np.float64


# -- kernels chosen by probing ---------------------------------------------------------------


class _FusedLosesUpdates(torch.optim.SGD):
    """An SGD whose fused kernel silently drops the update (as torch 2.13's does for
    bfloat16 on the CPU): the probe must not pick it."""

    def step(self, closure=None):
        if self.defaults.get("fused"):
            return None
        return super().step(closure)


class _ForeachMissing(torch.optim.SGD):
    def __init__(self, params, **kwargs):
        if kwargs.get("foreach") or kwargs.get("fused"):
            raise RuntimeError("no such kernel in this build")
        super().__init__(params, **kwargs)


def test_a_kernel_that_loses_updates_or_is_missing_is_not_chosen():
    from unitrain.backends.torch.kernels import optimizer_kernel

    settings = (("momentum", 0.9),)
    cpu = torch.device("cpu")
    assert optimizer_kernel(_FusedLosesUpdates, settings, cpu, torch.float32) == "foreach"
    assert optimizer_kernel(_ForeachMissing, settings, cpu, torch.float32) == "plain"
    assert optimizer_kernel(torch.optim.SGD, settings, cpu, torch.float32) == "fused"


@pytest.mark.parametrize("spec", [optim.SGD(momentum=0.9), optim.Adam()], ids=["sgd", "adam"])
def test_bfloat16_updates_move_every_parameter(spec):
    backend = TorchBackend(MODEL, BackendOptions(optimizer=spec, dtype="bfloat16", device="cpu"))
    before = backend.state_dict()
    _one_update(backend, data(16), 0.1)
    after = backend.state_dict()
    for name in ("model.layers.0.weight", "model.layers.1.weight", "model.layers.1.bias"):
        assert not np.array_equal(before[name], after[name]), name


def _one_update(backend, batch, lr):
    backend.forward(batch)
    backend.backward()
    backend.step(lr)


def test_the_finite_check_falls_back_where_the_amp_kernel_is_missing(monkeypatch):
    from unitrain.backends.torch import kernels

    def missing(grads, found, inv_scale):
        raise NotImplementedError("not implemented for 'BFloat16'")

    kernels._amp_check_works.cache_clear()
    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", missing)
    try:
        check = kernels.finite_check(torch.device("cpu"), torch.bfloat16)
        finite = [torch.ones(5, dtype=torch.bfloat16), torch.zeros(3, dtype=torch.bfloat16)]
        assert bool(check(finite))
        for bad in (float("nan"), float("inf"), -float("inf")):
            grads = [g.clone() for g in finite]
            grads[1][2] = bad
            assert not bool(check(grads))
        huge = [torch.full((64,), 3e38, dtype=torch.bfloat16)]  # an L2 norm would overflow
        assert bool(check(huge))
    finally:
        kernels._amp_check_works.cache_clear()


# -- buffers are model state -----------------------------------------------------------------


class _BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x.reshape(-1, 1, 4, 4))))
        return self.head(h.mean(dim=(2, 3)))


def _images(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)).astype(np.float32)
    return x, (x[:, :3].argmax(axis=1)).astype(np.int64)


def test_buffers_are_saved_restored_and_left_alone_by_evaluate():
    backend = TorchBackend(_BatchNormNet(), BackendOptions(optimizer=optim.SGD(momentum=0.9)))
    state = backend.state_dict()
    for name in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
        assert f"model.{name}" in state
        assert f"optimizer.{name}.momentum" not in state  # buffers have no optimizer slots
    assert state["model.bn.num_batches_tracked"].dtype == np.int64
    _one_update(backend, _images(), 0.1)
    trained = backend.state_dict()
    assert not np.array_equal(trained["model.bn.running_mean"], state["model.bn.running_mean"])
    assert int(trained["model.bn.num_batches_tracked"]) == 1
    backend.evaluate(_images(seed=1))
    after_eval = backend.state_dict()
    for key in trained:
        np.testing.assert_array_equal(after_eval[key], trained[key], err_msg=key)
    fresh = TorchBackend(_BatchNormNet(), BackendOptions(optimizer=optim.SGD(momentum=0.9)))
    fresh.load_state_dict(trained)
    for key, value in fresh.state_dict().items():
        np.testing.assert_array_equal(value, trained[key], err_msg=key)
    # The model part loads straight into the native module.
    native = _BatchNormNet()
    native.load_state_dict(
        {
            k.removeprefix("model."): torch.from_numpy(v)
            for k, v in trained.items()
            if k.startswith("model.")
        }
    )
    torch.testing.assert_close(
        native.bn.running_var, torch.from_numpy(trained["model.bn.running_var"])
    )


def test_the_digits_mlp_learns_in_bfloat16_with_sgd_momentum():
    """The README's recipe in bfloat16: it stayed at chance (val_accuracy 0.05-0.11) while
    torch's fused SGD dropped bfloat16 updates; 0.9749 measured after the fix."""
    from unitrain import ArrayLoader
    from unitrain.recipes import load_digits

    data = load_digits()
    train = ArrayLoader(data.x_train, data.y_train, batch_size=32, seed=0)
    schedule = schedules.Warmup(
        schedules.CosineDecay(0.1, decay_steps=9 * len(train), min_lr=1e-3),
        warmup_steps=len(train),
    )
    trainer = Trainer(
        models.MLP((64, 128, 10)),
        backend="torch",
        optimizer=optim.SGD(momentum=0.9),
        schedule=schedule,
        config=TrainerConfig(epochs=10, dtype="bfloat16", device="cpu"),
    )
    history = trainer.fit(train, (data.x_val, data.y_val))
    assert history[-1]["val_accuracy"] >= 0.95


@pytest.fixture
def no_host_reads(monkeypatch):
    """Make any read of a tensor's value on the host fail, while the fixture's flag is set."""
    reads: list[str] = []

    def forbid(name):
        original = getattr(torch.Tensor, name)

        def guarded(self, *args, **kwargs):
            if watching:
                reads.append(name)
                raise AssertionError(f"Tensor.{name} read a device value on the host")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, guarded)

    watching = False
    for name in ("__bool__", "item", "tolist", "numpy", "__float__", "__int__"):
        forbid(name)

    class Switch:
        def __enter__(self):
            nonlocal watching
            watching = True

        def __exit__(self, *exc):
            nonlocal watching
            watching = False

    return Switch()


@pytest.mark.parametrize("clip", [None, 1.0])
@pytest.mark.parametrize("spec", [optim.SGD(momentum=0.9), optim.Adam()], ids=["sgd", "adam"])
def test_a_fused_step_decides_its_skip_on_the_device(spec, clip, no_host_reads):
    """The non-finite guard of a fused kernel reads nothing back (on a GPU a read makes the
    host wait for every step); a poisoned update is skipped, counted when asked, and leaves
    parameters and optimizer state exactly as they were."""
    options = BackendOptions(optimizer=spec, grad_clip_norm=clip, device="cpu")
    backend, reference = TorchBackend(MODEL, options), NumpyBackend(MODEL, options)
    # The CPU reads the flag on the host (free there); the guard an accelerator gets is
    # installed by hand to test it here. float32 CPU SGD/Adam run fused, so it applies.
    backend._guard = device_guard(backend.optimizer.native, clip)
    assert backend._guard is not None
    x, y = data(16)
    poisoned = x.copy()
    poisoned[3, 2] = np.nan  # a NaN input: every gradient it reaches is NaN
    for lr, poison in ((0.1, False), (0.1, True), (0.05, False)):
        before = backend.state_dict()
        for b in (backend, reference):
            b.forward((poisoned if poison else x, y))
            b.backward()
        with no_host_reads:
            backend.step(lr)
        reference.step(lr)
        after = backend.state_dict()
        if poison:
            assert all(np.array_equal(before[k], after[k]) for k in before), "skip changed state"
    assert backend.skipped_steps == reference.skipped_steps == 1
    assert int(backend.state_dict()["optimizer.step"]) == 2
    expected = reference.state_dict()
    for name, value in backend.state_dict().items():
        np.testing.assert_allclose(value, expected[name], rtol=2e-6, atol=1e-7, err_msg=name)


def test_runs_that_need_each_outcome_on_the_host_keep_the_host_guard():
    """The CPU reads the flag (free there); on an accelerator, the fp16 loss scale needs each
    outcome, and AdamW (computed by hand, ``native`` None) and bfloat16 SGD on the CPU (whose
    fused kernel does not skip correctly) have no device flag to give. Dropout needs no
    outcome: its keys are numbered by the caller."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    sgd = TorchBackend(MODEL, BackendOptions(device="cpu")).optimizer.native
    assert sgd is not None and not reads_flag_on_host(cuda, False, sgd)
    assert reads_flag_on_host(cpu, False, sgd)
    assert reads_flag_on_host(cuda, True, sgd)
    adamw = TorchBackend(MODEL, BackendOptions(optimizer=optim.AdamW())).optimizer.native
    assert adamw is None and reads_flag_on_host(cuda, False, adamw)
    bfloat16_sgd = TorchBackend(MODEL, BackendOptions(dtype="bfloat16", device="cpu"))
    assert device_guard(bfloat16_sgd.optimizer.native, None) is None
    assert device_guard(sgd, None) is not None
    assert TorchBackend(MODEL, BackendOptions(device="cpu"))._guard is None


@pytest.mark.parametrize(
    ("layer", "shape", "width"),
    [
        (models.Linear(8, 4), (3, 8), 4),
        (models.Linear(8, 4), (2, 3, 8), 4),
        (models.MultiHeadAttention(8, 2), (2, 3, 8), 8),
        (models.BatchNorm(8), (4, 3, 3, 8), 8),
        (models.LayerNorm(8), (2, 3, 8), 8),
    ],
)
def test_layers_with_float32_parameters_keep_the_low_precision_under_autocast(layer, shape, width):
    """Layer outputs stay in autocast's dtype, as nn.Linear's and nn.BatchNorm2d's do. A
    Linear or attention projection adds its float32 master bias inside the autocast matmul:
    ``matmul(x, w) + bias`` would promote the bfloat16 product back to float32, and every
    later op would run in float32 (1.2x a Transformer step); the norms normalise in float32
    and hand on x's dtype (bfloat16 from the layer before). LayerNorm gave float32 here, as
    torch's autocast runs layer_norm, until the core made this the one policy."""
    module = PortableModule(layer, 0, torch.float32, "cpu")
    x = torch.randn(shape)
    if isinstance(layer, (models.BatchNorm, models.LayerNorm)):
        x = x.bfloat16()
    with torch.no_grad():
        exact = module(x.float())
        with torch.autocast("cpu", torch.bfloat16):
            low = module(x)
    assert low.dtype == torch.bfloat16 and low.shape == exact.shape == (*shape[:-1], width)
    assert torch.allclose(low.float(), exact, rtol=0.05, atol=0.05)


@dataclasses.dataclass(frozen=True)
class _Gain(models.AbstractLayer):
    """A user's layer, unknown to the adapter: a parameter, and a state that the gradient
    depends on, as a stateful LSTM's carried hidden state does."""

    width: int

    def own_param_shapes(self):
        return {"gain": (self.width,)}

    def own_state_shapes(self):
        return {"seen": (self.width,)}

    def _init_own_params(self, rng):
        return {"gain": np.full(self.width, 2.0)}

    def _init_own_state(self):
        return {"seen": np.zeros(self.width)}

    def forward(self, scope, x):
        seen = scope.state("seen")
        if scope.training:
            scope.set_state("seen", seen + ops.sum(x, axis=0))
        return x * scope.param("gain") + seen * scope.param("gain")  # saves seen for backward

    def _output_shape(self, shape):
        return shape


def test_any_layer_trains_under_its_canonical_names_after_to_and_in_functional_call():
    spec = models.Sequential([models.Linear(3, 4), _Gain(4), models.BatchNorm(4)])
    module = PortableModule(spec).to(torch.float64)  # .to() replaces every buffer
    assert [name for name, _ in module.named_parameters()] == list(spec.param_shapes())
    assert list(module.state_dict())[2:6] == ["1.gain", "1.seen", "2.weight", "2.bias"]
    x = torch.randn(5, 3, dtype=torch.float64)
    module(x).sum().backward()
    hidden = (x @ module.get_parameter("0.weight") + module.get_parameter("0.bias")).sum(0)
    torch.testing.assert_close(module.get_buffer("1.seen"), hidden.detach())
    assert module.get_parameter("1.gain").grad.abs().sum() > 0
    assert module.get_buffer("2.running_mean").abs().sum() > 0
    zeros = {name: torch.zeros_like(p) for name, p in module.named_parameters()}
    out = torch.func.functional_call(module.eval(), zeros, (x,))
    assert not out.any()  # the swapped-in parameters, not the module's own
    twin, seen = copy.deepcopy(module).train(), module.get_buffer("1.seen").clone()
    twin(x)  # moves the twin's own state only
    assert torch.equal(module.get_buffer("1.seen"), seen)
    assert torch.equal(twin.get_buffer("1.seen"), 2 * seen)


def test_dropout_masks_are_float32_draws_of_the_module_generator_in_layer_order():
    module = PortableModule(models.MLP((4, 8, 8, 3), dropout=0.5), dtype=torch.float64)
    module.generator.manual_seed(7)
    generator, h = torch.Generator().manual_seed(7), torch.randn(5, 4, dtype=torch.float64)
    out = module(h)
    weights = dict(module.named_parameters())
    for i in range(3):
        h = h @ weights[f"layers.{i}.weight"] + weights[f"layers.{i}.bias"]
        if i < 2:
            h = torch.relu(h) * (torch.rand(h.shape, generator=generator) < 0.5) / 0.5
    torch.testing.assert_close(out, h)
    with pytest.warns(DeprecationWarning, match="PortableModule"):
        old = TorchMLP(MODEL)
    assert list(old.state_dict()) == list(MODEL.param_shapes())


def test_build_optimizer_is_the_deprecated_name_of_on_fastest_kernel():
    from unitrain.backends.torch import kernels

    with pytest.warns(DeprecationWarning, match="use unitrain.backends.torch.kernels.on_fastest"):
        old = kernels.build_optimizer
    assert old is kernels.on_fastest_kernel
    params = [torch.nn.Parameter(torch.ones(3))]
    optimizer = old(torch.optim.SGD, params, {"momentum": 0.9})
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.param_groups[0]["momentum"] == 0.9


def test_a_model_without_parameters_builds_and_predicts():
    """torch.optim refuses an empty parameter list; such a model (pooling, an activation)
    gets the generic optimizer, which has nothing to update, so it can predict and export."""
    model = models.Sequential([models.ReLU(), models.Flatten()])
    backend = TorchBackend(model, BackendOptions(device="cpu", optimizer=optim.Adam()))
    x = np.array([[[-1.0, 2.0]]], np.float32)
    np.testing.assert_array_equal(backend.predict(x), [[0.0, 2.0]])
    assert backend.state_dict() == {"optimizer.step": 0}
