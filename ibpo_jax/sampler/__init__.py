"""Autoregressive sampling from the policy: the decode loop (`sampling`: immutable state and a
`lax.while_loop`, one jitted program per shape) and its pluggable strategies (`strategies`:
what picks the next token, when a row stops)."""
