"""Measuring: the bench and its baselines, the method table, the runner, replay without the target, the roofline
cost tables, ceilings, prompt sets."""
