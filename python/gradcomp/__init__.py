# SPDX-FileCopyrightText: 2026 The gradcomp authors
# SPDX-License-Identifier: Apache-2.0
"""gradcomp: gradient compression for distributed training, from PyTorch.

Two lines make a DistributedDataParallel model send compressed gradients::

    state = gradcomp.GradcompState(codec="topk:ratio=0.01", feedback="residual")
    ddp_model.register_comm_hook(state, gradcomp.hook)

The codec API (``Codec``, ``decompress``, ``inspect``) compresses CPU tensors into uint8
packets and back, for people who write their own exchange; ``Codec`` also compresses CUDA
tensors on the GPU where the package was built with its CUDA part (``has_cuda``; the codecs it
carries: ``cuda_codecs``). Two optimizers exchange for you, every step, over a process group:
``DeMo`` (Decoupled Momentum Optimization on the ``dct_sign`` codec) and ``OneBitAdam`` (the
library's calibrated 1-bit Adam). Errors are ``gradcomp.Error`` and its
kinds (``ConfigError``, ``FormatError``, ``NumericError``, ``CommError``), with the C++ library's
messages. ``DiLoCo`` turns a model and its optimizer into local-update training (DiLoCo,
Streaming DiLoCo, SparseLoCo) over a process group. See docs/pytorch.md.
"""

# torch first: it loads libtorch and libtorch_python, which the extension links against.
import torch  # noqa: F401

from ._C import (  # noqa: F401
    Codec,
    CommError,
    Communicator,
    ConfigError,
    Error,
    FormatError,
    NumericError,
    __version__,
    cuda_codecs,
    decompress,
    has_cuda,
    inspect,
)
from .capture import Capture, capture  # noqa: F401
from .ddp import GradcompState, hook  # noqa: F401
from .demo import DeMo  # noqa: F401
from .onebit_adam import OneBitAdam  # noqa: F401
from .diloco import DiLoCo  # noqa: F401

__all__ = [
    "Capture",
    "Codec",
    "CommError",
    "Communicator",
    "ConfigError",
    "DeMo",
    "DiLoCo",
    "Error",
    "FormatError",
    "GradcompState",
    "capture",
    "NumericError",
    "OneBitAdam",
    "cuda_codecs",
    "decompress",
    "has_cuda",
    "hook",
    "inspect",
]
