"""Re-measuring past predictions and recording the drift: a history of predictions, rounds that run a sample of them
again (with `orchestrator.validation`) and the retraining a drift calls for.

`history` (the versioned SQLite database of predictions and re-measurements), `record` (`scaledl plan --history`:
the report's best predictions stored), `rounds` (`scaledl revalidate`: one round, the rolling error, the drift
alert), `retrain` (`--retrain`: fine-tune on the rounds' runs, swapped in only if a held-out slice improves).
"""
