"""The `rlvr` CLI's command groups, one module each (`register(subparsers)`, listed in
clients/cli.py's COMMAND_GROUPS): `train` and `jobs`, `loops`, `eval`, `environments`, `events`,
`db`, and `rpc` (`rlvr call`: every RPC of every service, generated from the descriptors)."""
