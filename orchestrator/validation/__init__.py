"""Validating plans by real short runs: a plan's ranks run the composed runner on Ray, measured against the prediction.

`trials` (the Ray Tune driver: one trial per plan, and `scaledl plan --validate K`), `jobs` (what to run and what
came back), `placement` (placement groups shaped by the plan), `worker` (the rank actor), `run` (one run on the
cluster, failures as results), `measurable` (what the runner refuses and why), `rows` (profile-dataset rows),
`report_section` (the results as the report's tables and sentences). Re-measuring stored predictions later is
`orchestrator.revalidation`.
"""
