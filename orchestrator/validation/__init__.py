"""Validation by real short runs, split along its jobs; `orchestrator.validate` is the Tune driver.

`jobs` (what to run and what came back), `placement` (placement groups shaped by the plan), `worker` (the
rank actor), `run` (one run on the cluster, failures as results), `measurable` (what the runner refuses and
why), `rows` (profile-dataset rows); rendering is `orchestrator.validation_report`.
"""
