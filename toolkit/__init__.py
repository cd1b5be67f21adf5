"""tapeout: a trained model to a deployable artifact for a named device, under declared budgets."""

__version__ = "0.1.0"
