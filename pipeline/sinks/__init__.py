"""The sinks of the graph. The file names of `ragpulse run`'s outputs live here, apart from the
Beam writers in files.py, so the command's flags (and `explain`) name them without importing
Beam."""

VERDICTS_FILE = "verdicts.jsonl"
WINDOWS_FILE = "windows.jsonl"
DEAD_LETTER_FILE = "dead_letter.jsonl"
# The Prometheus textfile `ragpulse run` writes (pipeline.metrics.collector.write_textfile).
METRICS_FILE = "metrics.prom"
