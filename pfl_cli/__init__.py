"""pflx: a command-line tool suite for personalized federated learning."""

__version__ = "0.1.0"
