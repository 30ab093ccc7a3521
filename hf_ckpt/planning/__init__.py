"""The lab's planners: ``planner`` (``hf_ckpt.plan``: profile the blocks on real steps, then solve), ``profiling``
(the measured steps every planner and menu uses), ``menus`` (the op-level planner and the partition and outside
options it offers) and ``preserve`` (leave a model exactly as it was found); all solve with :mod:`hf_ckpt.solver`. Planners read the
runtime and hand it a :class:`~hf_ckpt.CheckpointPlan`; the runtime never imports them.
"""
