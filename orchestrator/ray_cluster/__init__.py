"""The Ray cluster a command uses: starting, joining and connecting to one, and nothing outliving the command.

`lifecycle` (`init_ray`, the reaper that kills what a started Ray leaves behind, SIGTERM as an interruption),
`address` (joining a running cluster by `--address` within seconds, or `ClusterUnreachable`), `connect` (connecting
this process and reading the connected cluster's nodes), `local` (Ray nodes on this machine, for tests and
benchmarks). Only the orchestrator imports Ray.
"""
