"""The whole-model engine (paper 1, Section 4, Appendices D-E): an MoE causal LM whose expert
operation runs through :mod:`moespec.kernels` with one dedup switch, verify-time measurement,
and speculative decoding with the oracle draft and with a real draft model."""

from moespec.engine.batch import BatchEngine, BatchLM
from moespec.engine.batch_speculative import BatchModelDraft, batch_generate
from moespec.engine.speculative import (ModelDraft, OracleDraft, Step, StepResult, speculative_generate,
                                        speculative_step, summarize_steps)
from moespec.engine.switch import SLOT_MAX, KernelExperts, Switch, install, moe_layers
from moespec.engine.target import Engine

__all__ = ["BatchEngine", "BatchLM", "BatchModelDraft", "Engine", "KernelExperts", "ModelDraft", "OracleDraft",
           "SLOT_MAX", "Step", "StepResult", "Switch", "batch_generate", "install", "moe_layers",
           "speculative_generate", "speculative_step", "summarize_steps"]
