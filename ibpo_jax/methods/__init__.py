"""The methods that add a stage to the RL step, as plug-ins (DESIGN §6-§7): Appendix B's
correction rollouts (`corrections`), PRM+GSPO's process reward (`prm`) and SCoRe's second
attempts (`score`). Each owns its config section, its code and its wiring, implements the small
protocols of `base` that the trainer calls at fixed points of an RL step, and is registered in
`registry.METHODS`; a new method is one module here plus its entry there
(docs/extending.md). Nothing is imported here, so that the config can import a method's section
alone.
"""
