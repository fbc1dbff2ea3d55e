"""The plan search: the valid plans priced in batches by predictor replicas, with Ray Tune or from the driver.

`run` (`run_search`: the searcher chosen, batches sent, answers collected), `tune` (the search as a Ray Tune run),
`types` (its options and result as plain data without Ray, which the reports read), `store` (where the answers go:
`OUT/evaluated/`, anytime and resumable), `replica` (a predictor replica without Ray, and `LocalPool` in the
driver), `ray_replicas` (the replicas as Ray actors), `levers` (after the search, memory levers tried on the plans
that overflow; `fixes` for `scaledl predict`), `wider_space` (whether the `full` space holds better plans).
Kept free of imports: the store's Ray worker imports `store` alone.
"""
