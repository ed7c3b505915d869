"""What the CLI, the SDK's exports and the web console show of a job, a loop or an episode, as
plain text rows and lines (no gRPC calls, no printing): `jobs`, `loops`, `episodes`."""
