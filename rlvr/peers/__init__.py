"""Typed clients of rlvr's services, shared by the services that call their peers and by the SDK.

`base` holds what every client has (deadlines, retries, `RlvrError`, health checks)."""
