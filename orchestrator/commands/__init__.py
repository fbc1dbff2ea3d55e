"""Subcommands of `scaledl`; each module is one command (see orchestrator/cli.py)."""
