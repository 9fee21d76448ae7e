"""oarctl: outcome-grounded advantage reshaping (OAR) for GRPO, as cacheable Parquet stages."""

__version__ = "0.1.0"
