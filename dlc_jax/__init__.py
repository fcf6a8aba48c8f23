"""dlc_jax: RL post-training for LLMs in JAX with discrepancy-lag correction (DLC).

Subpackages (one concern each):
  model/        Flax NNX Qwen3, HF checkpoint I/O, sharding rules, tiny test models
  rl/           pure jitted math: chunked logprobs, decomposition, ESS, losses, advantages
  sampler/      gRPC protocol, server, client, vLLM and JAX backends, weight transfer
  trainer/      train state, jitted step, async loop, resync policy, checkpoints
  data/         grain pipelines, tasks and reward functions
  experiments/  KL-to-on-policy harness and reports
  bench/        benchmarks against peers
"""

__version__ = "0.1.0"
