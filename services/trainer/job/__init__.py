"""A training job, knowing nothing of gRPC servers, NATS or processes (it reaches the reward and rollout
services through rlvr.peers' clients): today GRPO on a LoRA adapter.

Read it top to bottom from `runner.run_job` (a job from its start to its result), which builds TRL's
`GRPOTrainer` through `engine.py`, whose seams call the step in `step.py` (one GRPO step: generate,
score, update, push, publish). The loss is TRL's, chosen in `engine.LOSS_ARGS`; what a step measures
is `step_record.StepRecord`. The rest serves those three: where completions come from (`rollouts`,
`colocate`, `replicas`, `episodes`, `dynamic`, `prefetch`), how they are scored (`scorers`,
`heldout`), the job's files (`artifacts`, `stacking`, `merge`), its configuration (`config`,
`quantization`) and its ranks in a job of several processes (`distributed`).

The process layer (services/trainer/process/) runs a job here in a process of its own; nothing here
imports it (.importlinter).
"""
