"""What tuner ships instead of a download: the demo model and the demo task."""
