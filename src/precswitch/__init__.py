"""precswitch: does training in low precision and fine-tuning in high precision help or hurt?"""

__version__ = "0.1.0"

#: Version of the per-stage ``metrics.json`` layout (see docs/contracts.md, "metrics.json").
METRICS_SCHEMA_VERSION = 1
