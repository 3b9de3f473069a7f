"""ragpulse pipeline: inference-log events to windowed judge ratings."""
