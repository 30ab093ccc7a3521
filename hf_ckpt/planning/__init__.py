"""The lab's planners: ``planner`` (``hf_ckpt.plan``: profile the blocks on real steps, then solve), ``profiling``
(the measured steps every planner and menu uses), ``solver`` (the one dynamic-programming solver that picks each
block's option within a budget) and ``preserve`` (leave a model exactly as it was found). Planners read the
runtime and hand it a :class:`~hf_ckpt.CheckpointPlan`; the runtime never imports them.
"""
