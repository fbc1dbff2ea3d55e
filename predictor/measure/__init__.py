"""Real measurements on the local machine: which configurations are worth measuring (`design`, D-optimal), this
machine's identity that fingerprints what is measured (`machine`), device peaks, kernels, collectives, layers and whole
iterations."""
