"""Where a run executes: meshes and the one sharding spec (`sharding`), host memory on a
backend whose device memory is the host's (`hostmem`), and the accelerator facts the plan
prices (`chips`)."""
