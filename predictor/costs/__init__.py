"""What a plan costs on a graph and a cluster, below the predictors: a plan applied to the graph (`parallel`),
collectives and links (`comm`, `collective_curve`), mixtures of experts and their dispatchers (`moe`,
`moe_dispatch`), training features priced as their frameworks run them (`lora`, `muon`, `bf16_layers`), and the
answer's types (`prediction`, `prediction_table`). The predictors that combine these are `predictor.models`; memory
is `predictor.memory`, kernels `predictor.kernels`."""
