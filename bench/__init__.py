"""The benchmarks: scripts run as modules from the repository root (`python -m bench.NAME`); bench.common holds
what they share."""
