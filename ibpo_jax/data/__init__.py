"""Tasks, data sources, tokenizers and samplers (see ``tasks`` for the task list).

Importing this package registers every task in ``registry.TASKS``; heavy dependencies
(tensorflow_datasets, transformers, pyarrow) are imported only when a task or tokenizer that
needs them is used.
"""

from ibpo_jax.data.tasks import Task, get_task

__all__ = ["Task", "get_task"]
