"""Typed clients of rlvr's services, shared by the services that call their peers and by the SDK.

`base` holds the call machinery every client has (one RPC table per service yielding a sync and an
asyncio client; deadlines, retries, `RlvrError`, health checks), `clients` the tables and the
clients of the trainer, reward, rollout and benchmark services, and `types` the peer types
(`AdapterTag`, `Sampling`, `Score`) the trainer, the benchmark and users share."""
