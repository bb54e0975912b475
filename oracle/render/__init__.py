"""Renderers of a Report: console now; JSON is Report.write."""
