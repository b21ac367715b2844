"""The run directory, the one room both processes share: its names (layout), the lock, the event stream, its
checkpoints and the run's summary.  Pure: no torch, no textual."""
