"""The expert operation of one MoE layer: per-slot and deduplicating kernels (paper 1, Section 1)
as a torch reference, a C++ CPU extension and a CUDA extension, behind one function,
:func:`expert_forward`. Importing this package compiles nothing and does not touch CUDA.
"""

from moespec.kernels.build import ExtensionBuildError, available, load_cpu, load_cuda
from moespec.kernels.dispatch import BACKENDS, KERNELS, check_inputs, expert_forward, resolve_backend
from moespec.kernels.reference import groups_by_expert, reference_forward, torch_dedup, torch_slot
from moespec.kernels.weights import (BLOCK, KERNEL_FORMATS, ExpertWeights, dequantize_blocks,
                                     normalize_format, quantize_blocks)

__all__ = [
    "BACKENDS", "BLOCK", "KERNELS", "KERNEL_FORMATS", "ExpertWeights", "ExtensionBuildError", "available",
    "check_inputs", "dequantize_blocks", "expert_forward", "groups_by_expert", "load_cpu", "load_cuda",
    "normalize_format", "quantize_blocks", "reference_forward", "resolve_backend", "torch_dedup", "torch_slot",
]
