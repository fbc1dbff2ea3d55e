"""Real measurements on the local machine: device peaks, collectives, layers and whole iterations."""
