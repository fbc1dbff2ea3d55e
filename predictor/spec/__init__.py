"""What a user asks about, validated and resolved: the workload spec (model, training settings, cluster), the model
families and presets it names, the hardware catalogue, and `resolve`, which turns a spec into the one frozen value
that prices, launches and reports it."""
