"""Shared pytest settings."""

import logging

# kafka-python's background threads log after pytest has closed the captured streams of a
# finished test; without this every such line prints a "--- Logging error ---" traceback.
logging.raiseExceptions = False
