"""Probes: measurements on a base policy or on batches, no training (the `credit`,
`gradient_probe` and `prefix_credit` items run them), and the data and reward checks."""
