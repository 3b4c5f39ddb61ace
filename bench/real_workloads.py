"""The real workloads of bench/real.py (issue 38's table): code users run, built from torch.nn, torch.optim and
HF transformers as they ship, sized so that an eager call takes 0.2-20 ms on one thread of this machine.

Each workload gives `make()` (fresh arguments: called once per variant, after `torch.manual_seed(0)`, so that every
variant starts from the same state) and `fn` (the function compiled). `backward` rows time `fn(*args).backward()`.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


def _bench_run() -> Any:
    """bench/run.py (its decoder and HF Llama decode step), loaded by path: bench/ is not a package."""
    spec = importlib.util.spec_from_file_location("dealias_bench_run", Path(__file__).with_name("run.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


# --- torch.optim ------------------------------------------------------------------------------------
def optim_step(opt):
    opt.step()


def _optimizer(kind: str) -> Callable[[], tuple[Any, ...]]:
    """A torch.optim optimizer over 10 parameters of 256x256 with their gradients set."""

    def make() -> tuple[Any, ...]:
        params = [nn.Parameter(torch.randn(256, 256)) for _ in range(10)]
        for p in params:
            p.grad = torch.randn_like(p)
        if kind == "adam":
            return (torch.optim.Adam(params, lr=1e-3, foreach=True),)
        if kind == "adamw":
            return (torch.optim.AdamW(params, lr=1e-3, foreach=True),)
        if kind == "sgd":
            return (torch.optim.SGD(params, lr=1e-3, momentum=0.9, nesterov=True, foreach=True),)
        return (torch.optim.Adam(params, lr=1e-3, foreach=False),)

    return make


# --- convolution nets -------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 convs with BatchNorm, ReLU(inplace), a projected shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's resnet18, layer for layer (used when torchvision is not installed)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths, layers, cin = (64, 128, 256, 512), [], 64
        for i, w in enumerate(widths):
            layers.append(nn.Sequential(BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)))
            cin = w
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18() -> nn.Module:
    try:
        import torchvision
    except ImportError:
        return ResNet18()
    return torchvision.models.resnet18()


RESNET_INPUT = (1, 3, 64, 64)  # (a 224x224 image takes ~100 ms at 1 thread; 64x64 keeps the call in the ms)


def infer(model, x):
    with torch.no_grad():
        return model(x)


def train_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def forward(model, x):
    return model(x)


def _resnet(train: bool) -> Callable[[], tuple[Any, ...]]:
    def make() -> tuple[Any, ...]:
        model = resnet18().train(train)
        x = torch.randn(*RESNET_INPUT)
        return (model, x, torch.randint(0, 1000, (RESNET_INPUT[0],))) if train else (model, x)

    return make


class InvertedResidual(nn.Module):
    """MobileNetV2's block: a 1x1 expansion, a 3x3 depthwise convolution, a 1x1 projection, each with BatchNorm
    (ReLU6 after the first two), and the input added back where the sizes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.block = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU6(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False),
            nn.BatchNorm2d(mid),
            nn.ReLU6(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetLike(nn.Module):
    """A small MobileNetV2-style net (depthwise convolutions; torchvision-free): a strided 3x3 stem, seven inverted
    residual blocks, a 1x1 head, global pooling, a linear classifier."""

    def __init__(self, num_classes: int = 100) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True)]
        cin = 16
        for cout, stride in ((24, 2), (24, 1), (32, 2), (32, 1), (64, 2), (64, 1), (96, 1)):
            layers.append(InvertedResidual(cin, cout, stride, expand=6))
            cin = cout
        layers += [nn.Conv2d(cin, 320, 1, bias=False), nn.BatchNorm2d(320), nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(320, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


MOBILENET_INPUT = (4, 3, 64, 64)


def _mobilenet(train: bool) -> Callable[[], tuple[Any, ...]]:
    def make() -> tuple[Any, ...]:
        model = MobileNetLike().train(train)
        x = torch.randn(*MOBILENET_INPUT)
        return (model, x, torch.randint(0, 100, (MOBILENET_INPUT[0],))) if train else (model, x)

    return make


def _conv_bn_relu() -> tuple[Any, ...]:
    model = nn.Sequential(nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(inplace=True)).train()
    return (model, torch.randn(4, 32, 32, 32))


# --- transformers -----------------------------------------------------------------------------------
def lm_logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _gpt2() -> tuple[Any, ...]:
    import transformers

    # GPT-2's architecture (tied embeddings, Conv1D projections, GELU) at a width that runs in milliseconds
    config = transformers.GPT2Config(
        vocab_size=2000, bos_token_id=0, eos_token_id=0, n_positions=256, n_embd=256, n_layer=4, n_head=4
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    return (model, torch.randint(0, 2000, (1, 32)))


def self_attention(mha, x):
    return mha(x, x, x)


def _mha() -> tuple[Any, ...]:
    return (nn.MultiheadAttention(256, 4, batch_first=True), torch.randn(4, 64, 256))


_RUN = _bench_run()
decode_step = _RUN.decode_step  # the gpt-fast style decoder of bench/run.py, its KV cache written at a tensor position
hf_static_decode = _RUN.hf_static_decode


# --- small fused programs ---------------------------------------------------------------------------
def ema_update(ema, params):
    torch._foreach_lerp_(ema, params, 0.001)


def _ema() -> tuple[Any, ...]:
    # the parameters of a 3-layer MLP of width 1024: 6 tensors, weights and biases
    shapes = [(1024, 1024), (1024,), (1024, 1024), (1024,), (10, 1024), (10,)]
    params = [torch.randn(s) for s in shapes]
    return ([p + 0.1 * torch.randn_like(p) for p in params], params)  # (the average lags the parameters)


def gauss_seidel(u, f, h2: float):
    """One red-black Gauss-Seidel sweep of the Poisson equation, in place: the red points (i + j even) from their
    black neighbours, then the black ones from the updated red ones. Each colour is two strided views of u."""
    n = u.shape[0]
    for i0, j0 in ((1, 1), (2, 2), (1, 2), (2, 1)):
        c = u[i0 : n - 1 : 2, j0 : n - 1 : 2]
        up, down = u[i0 - 1 : n - 2 : 2, j0 : n - 1 : 2], u[i0 + 1 : n : 2, j0 : n - 1 : 2]
        left, right = u[i0 : n - 1 : 2, j0 - 1 : n - 2 : 2], u[i0 : n - 1 : 2, j0 + 1 : n : 2]
        c.copy_((up + down + left + right - h2 * f[i0 : n - 1 : 2, j0 : n - 1 : 2]) * 0.25)


def _gauss_seidel() -> tuple[Any, ...]:
    n = 514  # 512x512 interior points, a boundary of zeros
    u = torch.zeros(n, n)
    u[1:-1, 1:-1] = torch.rand(n - 2, n - 2)
    return (u, torch.randn(n, n), 1.0 / (n - 1) ** 2)


@dataclass
class Workload:
    name: str
    title: str
    fn: Callable[..., Any]
    make: Callable[[], tuple[Any, ...]]
    backward: bool = False  # time fn(*args).backward(), the backward compiled with the forward


WORKLOADS = [
    Workload("adam_foreach", "`torch.optim.Adam(foreach=True).step()`", optim_step, _optimizer("adam")),
    Workload("adamw_foreach", "`torch.optim.AdamW(foreach=True).step()`", optim_step, _optimizer("adamw")),
    Workload(
        "sgd_foreach", "`torch.optim.SGD(momentum, nesterov, foreach=True).step()`", optim_step, _optimizer("sgd")
    ),
    Workload("adam_loop", "`torch.optim.Adam(foreach=False).step()`", optim_step, _optimizer("adam_loop")),
    Workload("resnet18_eval", "resnet18 eval, `no_grad`", infer, _resnet(False)),
    Workload("resnet18_train", "resnet18 forward + loss, training", train_loss, _resnet(True)),
    Workload("resnet18_train_bwd", "resnet18 forward + loss + backward", train_loss, _resnet(True), backward=True),
    Workload("mobilenet_eval", "mobilenet-style (depthwise) eval, `no_grad`", infer, _mobilenet(False)),
    Workload("mobilenet_train", "mobilenet-style (depthwise) forward + loss, training", train_loss, _mobilenet(True)),
    Workload(
        "mobilenet_train_bwd",
        "mobilenet-style (depthwise) forward + loss + backward",
        train_loss,
        _mobilenet(True),
        backward=True,
    ),
    Workload("conv_bn_relu", "conv + BatchNorm2d + ReLU(inplace), training forward", forward, _conv_bn_relu),
    Workload("gpt2", "transformers GPT-2 forward (tied embeddings), `no_grad`", lm_logits, _gpt2),
    Workload("mha", "`nn.MultiheadAttention` `mha(x, x, x)`", self_attention, _mha),
    Workload("gpt_fast_decode", "gpt-fast style decode step (tensor position)", decode_step, _RUN._decoder_args),
    Workload("hf_llama_decode", "transformers Llama static-cache decode", hf_static_decode, _RUN._hf_decode_args),
    Workload("ema_foreach", "`_foreach_lerp_` EMA over 6 tensors", ema_update, _ema),
    Workload("gauss_seidel", "red-black Gauss-Seidel step (strided views)", gauss_seidel, _gauss_seidel),
]
