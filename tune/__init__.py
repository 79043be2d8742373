"""kog.tune: Optuna search over the engine's configuration (`kogtune`)."""
