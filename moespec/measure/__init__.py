"""How moespec measures (paper 1, Section 2 and Appendix E): the one timing harness
(:mod:`~moespec.measure.timing`), bandwidth regimes (:mod:`~moespec.measure.regimes`), the pass ids
(:mod:`~moespec.measure.ids`), the expert-operation benchmark of notebooks 02/03
(:mod:`~moespec.measure.expert_op`), the CUDA layer stack and peers (:mod:`~moespec.measure.layer_stack`,
:mod:`~moespec.measure.cuda_peers`), ggml's CPU peer (:mod:`~moespec.measure.ggml_peer`), and what the
benchmark scripts in ``benchmarks/`` share (:mod:`~moespec.measure.protocols`). The scripts
themselves live in ``benchmarks/``; this package is their library. :mod:`~moespec.measure.load`
declares the machine state a block is measured in (quiet, or under a background load)."""
