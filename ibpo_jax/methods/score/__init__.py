"""SCoRe+GRPO (Table 1, DESIGN §7): a second attempt at every response, trained with GRPO.

`config` (the `score` section) and `method` (the registered method: the second attempts as an
extra round of the RL step, and the second attempt as the method's answer in evaluation).
Nothing is imported here, so that the config can import its section alone.
"""
